"""The pieces of benchmarks/bench_overlap.py and soak_abort.py that run without root or a server: the link's
spelling, the in-process collective delay, a traced step's breakdown, and the soak's memory verdict."""

from __future__ import annotations

import time
from types import SimpleNamespace

from benchmarks.bench_overlap import breakdown
from benchmarks.common.sim_network import DELAY_ENV, Link, delay_collectives
from benchmarks.soak_abort import flatness
from rapid_llm.distributed.timeline import Span


def test_link_parses_rate_and_delay() -> None:
    assert Link.parse("1gbit:1.5") == Link("1gbit", 1.5)
    assert Link.parse("100mbit") == Link("100mbit", 0.0)


def test_delayed_collectives_complete_no_earlier_than_the_delay(monkeypatch) -> None:
    calls = []

    class Work:
        def wait(self) -> None:
            calls.append("wait")

    def all_reduce(tensor: object, async_op: bool = False) -> Work:
        calls.append(f"issued async_op={async_op}")
        return Work()

    module = SimpleNamespace(all_reduce=all_reduce)
    monkeypatch.setenv(DELAY_ENV, "30")
    assert delay_collectives(("all_reduce",), module) == 30.0
    started = time.perf_counter()
    assert module.all_reduce(None) is None  # blocking: returns after the delay
    assert time.perf_counter() - started >= 0.03
    work = module.all_reduce(None, async_op=True)
    issued = time.perf_counter()
    time.sleep(0.01)
    work.wait()
    assert time.perf_counter() - issued >= 0.03
    assert calls == ["issued async_op=True", "wait", "issued async_op=True", "wait"]


def test_breakdown_splits_a_traced_step() -> None:
    spans = [Span("turn", "micro-batch 0", "a", 0.0, 0.010), Span("issue", "all_reduce", "a", 0.009, 0.010),
             Span("turn", "micro-batch 1", "b", 0.011, 0.020), Span("wait", "all_reduce", "b", 0.012, 0.014)]
    assert {key: round(value, 6) for key, value in breakdown(spans, 0.021).items()} == {
        "wall": 21.0, "compute": 16.0, "idle": 2.0, "exposed all_reduce": 3.0}
    assert breakdown([Span("issue", "all_to_all", "main", 0.0, 0.004)], 0.010)["compute"] == 6.0


def test_soak_memory_is_flat_unless_a_process_grows() -> None:
    def rounds(series: list[float]) -> list[dict]:
        return [{"resources": {"processes": [{"title": "worker0", "rss_mib_mean": value}]}} for value in series]

    assert flatness(rounds([900, 400, 401, 400, 402, 401, 403]), 32)["flat"]
    assert not flatness(rounds([400, 400, 410, 430, 450, 470, 490]), 32)["flat"]
