"""bench_parallel.py's layout names and its table: TGS per device and efficiency against the one-rank row."""

from __future__ import annotations

import pytest

from benchmarks.bench_parallel import parse_layout, table


@pytest.mark.parametrize(("text", "layout"), [("tp1", (1, 1, 1, 1, 1)), ("tp4", (4, 1, 1, 1, 1)),
                                              ("dp2", (1, 1, 1, 1, 2)), ("tp2dp2", (2, 1, 1, 1, 2)),
                                              ("pp2", (1, 2, 1, 1, 1)), ("tp2pp2", (2, 2, 1, 1, 1)),
                                              ("tp2dcp2", (2, 1, 2, 1, 1)), ("pcp2", (1, 1, 1, 2, 1)),
                                              ("tp2pcp2dp2", (2, 1, 1, 2, 2))])
def test_layouts_parse(text: str, layout: tuple[int, int, int, int, int]) -> None:
    assert parse_layout(text) == layout


@pytest.mark.parametrize("text", ["", "pp2tp2", "tp", "dp2tp2", "tp2 x"])
def test_bad_layouts_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="must be tpN, ppN, dcpN, pcpN, dpN"):
        parse_layout(text)


def row(layout: str, devices: int, throughput: float, collectives: float = 0.0) -> dict:
    return {"layout": layout, "devices": devices, "cpu_threads_per_rank": 1, "output_throughput": throughput,
            "tgs": throughput / devices, "collective_seconds": collectives, "collective_share": collectives / 10,
            "mean_ttft_ms": 250.0}


def test_table_reports_efficiency_against_one_rank() -> None:
    lines = table([row("tp1dp1", 1, 100.0), row("tp2dp1", 2, 150.0, 4.0)]).splitlines()
    assert lines[2].split("|")[6].strip() == "1.00"
    tp2 = [cell.strip() for cell in lines[3].split("|")]
    assert tp2[4:10] == ["150.0", "75.0", "0.75", "4.00", "40%", "250"]


def test_table_without_a_one_rank_row_has_no_efficiency() -> None:
    assert table([row("tp2dp1", 2, 150.0)]).splitlines()[2].split("|")[6].strip() == "n/a"
