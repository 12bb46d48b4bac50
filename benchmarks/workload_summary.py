"""Markdown tables for the result directories of scheduler_workloads.sh and peers/compare_long_context.sh.

    python benchmarks/workload_summary.py scheduler benchmark-results/scheduler-workloads-20261202
    python benchmarks/workload_summary.py long-context benchmark-results/long-context-20261202
    python benchmarks/workload_summary.py prefix-order benchmark-results/prefix-order-20261202

Reads only the bench_serving.py result JSONs (and the metrics_sampler.py series) the scripts saved; every
number printed is a field of those files or computed from their per-request arrays (--save-detailed): the
latency seen from arrival (client queue + E2EL) and the largest inter-token gap (the max stall).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.metrics_sampler import hit_rate_series

Row = dict[str, Any]


def load(path: Path) -> Row:
    return json.loads(path.read_text())


def percentiles_ms(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> list[float]:
    return [1000 * float(np.percentile(values, p)) for p in points] if values else [float("nan")] * len(points)


def max_stall_ms(result: Row) -> float:
    """The largest gap between two streamed chunks of any request (needs --save-detailed)."""
    return 1000 * max((gap for itl in result["itls"] for gap in itl), default=float("nan"))


def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.1f}" if isinstance(value, float) else str(value)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def runs(directory: Path, pattern: str) -> list[tuple[str, Row]]:
    return [(path.stem, load(path)) for path in sorted(directory.glob(pattern))]


def batching_section(directory: Path) -> str:
    header = ["run", "output tok/s", "req/s", "duration s", "TTFT P50/P90/P99 ms", "E2EL P50/P90/P99 ms",
              "arrival-to-end P50/P90/P99 ms", "TPOT P50 ms"]
    rows = []
    for name, r in runs(directory, "*.json"):
        from_arrival = [q + e for q, e in zip(r["queue_times"], r["latencies"])]
        rows.append([name, r["output_throughput"], r["request_throughput"], r["duration"],
                     "/".join(f"{r[f'p{p}_ttft_ms']:.0f}" for p in (50, 90, 99)),
                     "/".join(f"{r[f'p{p}_e2el_ms']:.0f}" for p in (50, 90, 99)),
                     "/".join(f"{v:.0f}" for v in percentiles_ms(from_arrival)), r["median_tpot_ms"]])
    return "### Continuous vs static batching (static emulated on the client)\n\n" + table(header, rows)


def chunked_section(directory: Path) -> str:
    header = ["run", "decode ITL P50/P90/P99 ms", "max stall ms", "decode TPOT P50/P90/P99 ms", "decode tok/s",
              "1500-token TTFT P50/P90/P99 ms"]
    rows = []
    for name, decode in runs(directory, "decode-*.json"):
        prefill = load(directory / (name.replace("decode-", "prefill-", 1) + ".json"))
        rows.append([name.removeprefix("decode-"),
                     "/".join(f"{decode[f'p{p}_itl_ms']:.1f}" for p in (50, 90, 99)), max_stall_ms(decode),
                     "/".join(f"{decode[f'p{p}_tpot_ms']:.1f}" for p in (50, 90, 99)), decode["output_throughput"],
                     "/".join(f"{prefill[f'p{p}_ttft_ms']:.0f}" for p in (50, 90, 99))])
    return "### Chunked prefill (long prompts arriving during decodes)\n\n" + table(header, rows)


def hit_rate_trace(series: list[Row]) -> str:
    """The cumulative hit rate in % per sample, from the first sample with queries ("–" if none had any)."""
    rates = [s["cumulative_hit_rate"] for s in series]
    first = next((i for i, rate in enumerate(rates) if rate is not None), len(rates))
    return " ".join(f"{100 * rate:.0f}" for rate in rates[first:]) or "–"


def prefix_section(directory: Path) -> str:
    header = ["caching", "hit rate", "TTFT P50/P90/P99 ms", "E2EL P50/P90/P99 ms", "TPOT P50 ms", "output tok/s",
              "hit rate per second (cumulative)"]
    rows = []
    for mode in ("on", "off"):
        path = directory / f"gsp-caching-{mode}.json"
        if not path.is_file():
            continue
        r = load(path)
        samples = [json.loads(line) for line in (directory / f"gsp-caching-{mode}-counters.jsonl").read_text().splitlines()]
        series = hit_rate_series(samples, "rapid_llm:prefix_cache_queries_total", "rapid_llm:prefix_cache_hits_total")
        total = series[-1]["cumulative_hit_rate"] if series else None
        rows.append([mode, "–" if total is None else f"{100 * total:.1f} %",
                     "/".join(f"{r[f'p{p}_ttft_ms']:.0f}" for p in (50, 90, 99)),
                     "/".join(f"{r[f'p{p}_e2el_ms']:.0f}" for p in (50, 90, 99)), r["median_tpot_ms"],
                     r["output_throughput"],
                     hit_rate_trace(series)])
    return "### Prefix caching (shared system prompts)\n\n" + table(header, rows)


# The shared-prompt workload of scheduler_workloads.sh prefix-order (and prefix_cache_ab.sh).
GSP_WORKLOAD = {"num_groups": 8, "prompts_per_group": 8, "system_prompt_len": 512, "question_len": 64,
                "output_len": 32, "seed": 0}


def cold_requests(result: Row) -> list[bool]:
    """Per request (in send order of the file): it had to compute its system prompt -- sent before the first
    request of its group had its first token (so no block of that prompt was cached yet)."""
    from benchmarks.common.datasets import load_tokenizer, sample_generated_shared_prefix

    requests = sample_generated_shared_prefix(load_tokenizer(result["tokenizer_id"]), **GSP_WORKLOAD)
    if len(requests) != len(result["ttfts"]):
        raise ValueError(f"{len(result['ttfts'])} requests in the result, {len(requests)} in the workload")
    groups = [request.prompt.split("\n\n", 1)[0] for request in requests]
    first_token: dict[str, float] = {}
    for index in sorted(range(len(groups)), key=lambda i: result["start_times"][i]):
        first_token.setdefault(groups[index], result["start_times"][index] + result["ttfts"][index])
    return [result["start_times"][i] < first_token[groups[i]] for i in range(len(groups))]


def prefix_order_section(directory: Path) -> str:
    header = ["run", "TTFT P50/P90/P99 ms", "cold requests", "cold TTFT P50/max ms", "warm TTFT P50/max ms",
              "first 8 sent: TTFT P50/max ms", "the 7 slowest TTFTs: send rank (c = cold)"]
    rows = []
    for name, r in runs(directory, "caching-*.json"):
        cold = cold_requests(r)
        order = sorted(range(len(cold)), key=lambda i: r["start_times"][i])
        rank = {index: position for position, index in enumerate(order)}
        ttfts = r["ttfts"]

        def p50_max(indices: list[int]) -> str:
            values = [ttfts[i] for i in indices]
            return f"{1000 * float(np.median(values)):.0f}/{1000 * max(values):.0f}" if values else "–"

        slowest = sorted(range(len(ttfts)), key=lambda i: -ttfts[i])[:7]
        rows.append([name, "/".join(f"{v:.0f}" for v in percentiles_ms(ttfts)), sum(cold),
                     p50_max([i for i in order if cold[i]]), p50_max([i for i in order if not cold[i]]),
                     p50_max(order[:8]), " ".join(f"{rank[i]}{'c' if cold[i] else ''}" for i in slowest)])
    return "### Prefix caching: TTFT by send order, cold vs warm requests\n\n" + table(header, rows)


def long_context_section(directory: Path) -> str:
    header = ["system", "input len (requested)", "conc.", "prefill tok/s (input / TTFT)", "TTFT P50 ms", "TPOT P50 ms",
              "TPOT P99 ms", "ITL P99 ms", "output tok/s", "KV capacity (requests)"]
    rows = []
    for name, r in runs(directory, "*.json"):
        system, length, concurrency = name.rsplit("-", 2)
        mean_input = r["total_input_tokens"] / max(r["completed"], 1)
        info = (r.get("environment") or {}).get("server_info") or {}
        sidecar = directory / f"{system}-kv-cache-tokens.txt"  # a peer without /server_info: from its log
        kv_tokens = info.get("kv_cache_tokens") or (int(sidecar.read_text()) if sidecar.is_file() else None)
        output_len = r["total_output_tokens"] / max(r["completed"], 1)
        capacity = f"{kv_tokens // int(mean_input + output_len)}" if kv_tokens else "–"
        rows.append([system, int(length), concurrency.removeprefix("c"),
                     mean_input / (r["median_ttft_ms"] / 1000), r["median_ttft_ms"], r["median_tpot_ms"],
                     r.get("p99_tpot_ms", "–"), r.get("p99_itl_ms", "–"), r["output_throughput"], capacity])
    rows.sort(key=lambda row: (row[1], int(row[2]), row[0]))
    return "### Long context\n\n" + table(header, rows)


SECTIONS: dict[str, list[tuple[str, Callable[[Path], str]]]] = {
    "scheduler": [("batching", batching_section), ("chunked", chunked_section), ("prefix", prefix_section),
                  ("prefix-order", prefix_order_section)],
    "long-context": [(".", long_context_section)],
    "prefix-order": [("prefix-order", prefix_order_section)],
}


def summarize(kind: str, directory: Path) -> str:
    parts = [section(directory / sub) for sub, section in SECTIONS[kind] if (directory / sub).is_dir()]
    if not parts:
        raise ValueError(f"{directory} holds no {kind} results")
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("kind", choices=list(SECTIONS))
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    print(summarize(args.kind, args.directory), end="")


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as exc:
        sys.exit(f"error: {exc}")
