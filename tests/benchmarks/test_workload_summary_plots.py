"""workload_summary.py and plots.py on small saved results: the tables' numbers and the PNGs they draw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import plots, workload_summary

QUERIES, HITS = "rapid_llm:prefix_cache_queries_total", "rapid_llm:prefix_cache_hits_total"


def result(label: str, model: str, concurrency: int | None, input_len: int, **fields: object) -> dict:
    metrics = {f"p{p}_{m}_ms": float(p) for p in (50, 90, 99) for m in ("ttft", "tpot", "itl", "e2el")}
    return {"label": label, "backend": "openai", "model_id": f"/models/{model}", "max_concurrency": concurrency,
            "completed": 2, "total_input_tokens": 2 * input_len, "total_output_tokens": 64, "duration": 2.0,
            "output_throughput": 100.0 * (concurrency or 1), "request_throughput": 1.0, "median_ttft_ms": input_len / 10,
            "median_tpot_ms": 5.0, **metrics, **fields}


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_scheduler_summary_computes_arrival_latency_stall_and_hit_rate(tmp_path: Path) -> None:
    write(tmp_path / "batching/static-1.json", result("static", "m", 2, 10, queue_times=[0.0, 1.0],
                                                        latencies=[1.0, 2.0]))
    write(tmp_path / "chunked/decode-budget256-1.json", result("d", "m", 4, 64, itls=[[0.01, 0.25], [0.02]]))
    write(tmp_path / "chunked/prefill-budget256-1.json", result("p", "m", None, 1500))
    write(tmp_path / "prefix/gsp-caching-on.json", result("on", "m", 8, 800))
    (tmp_path / "prefix/gsp-caching-on-counters.jsonl").write_text("\n".join(json.dumps(s) for s in (
        {"t": 0, QUERIES: 0, HITS: 0}, {"t": 1, QUERIES: 100, HITS: 50}, {"t": 2, QUERIES: 200, HITS: 150})))
    text = workload_summary.summarize("scheduler", tmp_path)
    # arrival-to-end = queue + E2EL: [1, 3] s -> P50 2000 ms, P90 2800 ms, P99 2980 ms.
    assert "| static-1 | 200.0 | 1.0 | 2.0 | 50/90/99 | 50/90/99 | 2000/2800/2980 | 5.0 |" in text
    assert "| budget256-1 | 50.0/90.0/99.0 | 250.0 |" in text
    assert "| on | 75.0 % |" in text and "| 50 75 |" in text
    # Seconds before the first query are left out; a run without any shows a dash.
    assert workload_summary.hit_rate_trace([{"cumulative_hit_rate": None}, {"cumulative_hit_rate": 0.5}]) == "50"
    assert workload_summary.hit_rate_trace([{"cumulative_hit_rate": None}]) == "–"


def test_long_context_summary_reads_kv_capacity_from_server_info_or_sidecar(tmp_path: Path) -> None:
    write(tmp_path / "rapid_llm-1000-c1.json", result("rapid_llm", "m", 1, 1000,
                                                      environment={"server_info": {"kv_cache_tokens": 10320}}))
    write(tmp_path / "vllm-1000-c1.json", result("vllm", "m", 1, 1000, environment={"server_info": None}))
    (tmp_path / "vllm-kv-cache-tokens.txt").write_text("2064")
    text = workload_summary.summarize("long-context", tmp_path)
    # input 1000 / TTFT 100 ms = 10000 tok/s; TPOT and ITL P99 as saved; capacity = KV tokens // (1000 + 32).
    assert "| rapid_llm | 1000 | 1 | 10000.0 | 100.0 | 5.0 | 99.0 | 99.0 | 100.0 | 10 |" in text
    assert "| vllm | 1000 | 1 | 10000.0 | 100.0 | 5.0 | 99.0 | 99.0 | 100.0 | 2 |" in text
    with pytest.raises(ValueError, match="no long-context results"):
        workload_summary.summarize("long-context", tmp_path / "absent")


def test_plots_draw_both_figures_from_saved_results(tmp_path: Path) -> None:
    for label in ("rapid_llm", "vllm"):
        for concurrency in (1, 8):
            write(tmp_path / "compare" / f"{label}-c{concurrency}.json", result(label, "llama", concurrency, 128))
        for length in (1000, 4000):
            write(tmp_path / "long" / f"{label}-{length}.json", result(label, "llama-8k", 1, length))
    write(tmp_path / "compare/not-a-result.json", {"other": 1})
    written = plots.main(["--throughput", str(tmp_path / "compare"), "--input-length", str(tmp_path / "long"),
                          "--out", str(tmp_path / "images")])
    assert [p.name for p in written] == ["throughput_vs_concurrency.png", "latency_vs_input_length.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") and p.stat().st_size > 10_000 for p in written)
    series = plots.throughput_series(plots.load_results([tmp_path / "compare"]))
    assert series == {"llama": {"rapid_llm": [(1, 100.0), (8, 800.0)], "vllm": [(1, 100.0), (8, 800.0)]}}
    with pytest.raises(ValueError, match="no bench_serving results"):
        plots.load_results([tmp_path / "images"])
