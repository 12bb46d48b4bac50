"""metrics_sampler.py: Prometheus parsing, the hit-rate series, and sampling a live HTTP /metrics."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from benchmarks.metrics_sampler import hit_rate_series, main, parse_counters

QUERIES, HITS = "rapid_llm:prefix_cache_queries_total", "rapid_llm:prefix_cache_hits_total"


def test_parse_counters_sums_label_sets_and_reports_absent_ones() -> None:
    text = (f"# HELP {QUERIES} Prompt tokens looked up.\n# TYPE {QUERIES} counter\n"
            f'{QUERIES}{{model="a"}} 100.0\n{QUERIES}{{model="b"}} 20\n{HITS} 64 1700000000\n'
            f"{HITS}_created 123.0\n")
    assert parse_counters(text, [QUERIES, HITS, "missing_total"]) == {QUERIES: 120.0, HITS: 64.0, "missing_total": None}


def test_hit_rate_series_per_interval_and_cumulative() -> None:
    samples = [{"t": 0.0, QUERIES: 10.0, HITS: 0.0}, {"t": 1.0, QUERIES: 110.0, HITS: 50.0},
               {"t": 2.0, QUERIES: 110.0, HITS: 50.0}, {"t": 3.0, QUERIES: 210.0, HITS: 150.0}]
    series = hit_rate_series(samples, QUERIES, HITS)
    assert [s["interval_hit_rate"] for s in series] == [0.5, None, 1.0]
    assert [s["cumulative_hit_rate"] for s in series] == [0.5, 0.5, 0.75]
    assert [s["queries"] for s in series] == [100.0, 0.0, 100.0]


@pytest.fixture
def counting_server() -> Iterator[str]:
    """/metrics whose counters grow by 10 queries and 4 hits per request."""
    calls = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            calls["n"] += 1
            body = f"{QUERIES} {10 * calls['n']}\n{HITS} {4 * calls['n']}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_sampler_writes_a_series_until_its_duration(counting_server: str, tmp_path: Path) -> None:
    out = tmp_path / "counters.jsonl"
    written = main(["--base-url", counting_server, "--counters", QUERIES, HITS, "absent_total",
                    "--interval", "0.05", "--duration", "0.2", "--out", str(out)])
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == len(samples) >= 3
    assert [s[QUERIES] for s in samples] == [10.0 * (i + 1) for i in range(len(samples))]
    assert all(s["absent_total"] is None for s in samples)
    assert samples[0]["t"] == 0.0 and samples[-1]["t"] >= 0.2 and samples == sorted(samples, key=lambda s: s["t"])
    assert {s["interval_hit_rate"] for s in hit_rate_series(samples, QUERIES, HITS)} == {0.4}


def test_sampler_rejects_a_non_positive_interval(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--counters", QUERIES, "--interval", "0", "--out", str(tmp_path / "x.jsonl")])
