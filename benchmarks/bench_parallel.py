"""Serving throughput at each parallel layout: TGS (output tokens/s per device), scaling efficiency and the
time rank 0 spends in collectives, measured.

    python benchmarks/bench_parallel.py --model MODEL_DIR --layouts tp1,tp2,dp2 [--num-prompts 32 ...]

Key design choice: one real server per layout, driven by bench_serving's random workload (the same prompts:
same seed), so the numbers are what a client sees. A device is a rank: a GPU, or on the CPU one worker
process with its share of the cores (`--tp 2` on a 2-core host gives each rank one thread). TGS = output
tokens/s / (tp * pp * pcp * dp); efficiency = TGS / TGS of tp1 (1.0 = linear scaling). Collective time is the
`rapid_llm:collective_seconds` counter (distributed/collective_timer.py: wall time inside every
all-reduce / all-gather / broadcast of rank 0 of each replica, summed over replicas) read before and after
the run; its share is that time over the run's duration per replica. On CUDA set
RAPID_LLM_TIME_COLLECTIVES=1 and pass --server-args=--enforce-eager for it to be non-zero. With pipeline stages
the reporting rank is the last stage's first rank, and its collective time is mostly the wait for the previous
stage's hidden states: with TP 1 its share is the pipeline bubble as the last stage sees it.
Layouts: tpN, ppN, dcpN, pcpN, dpN and their concatenations (tp2pp2, tp2dcp2, pcp2, tp2dp2); the JSON's
`kv_cache_tokens` is the context one request may use (a DCP group holds N times one rank's). Results: a markdown
table on stdout (with mean TTFT, where prefill context parallelism should show) and --out JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks import bench_serving
from benchmarks.common.environment import collect_environment
from benchmarks.common.server_process import ServerProcess

_LAYOUT = re.compile(r"(?:tp(\d+))?(?:pp(\d+))?(?:dcp(\d+))?(?:pcp(\d+))?(?:dp(\d+))?")


def parse_layout(text: str) -> tuple[int, int, int, int, int]:
    """(tp, pp, dcp, pcp, dp): 'tp2' -> (2, 1, 1, 1, 1), 'pp2' -> (1, 2, 1, 1, 1), 'tp2dcp2' -> (2, 1, 2, 1, 1)."""
    match = _LAYOUT.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(f"layout {text!r} must be tpN, ppN, dcpN, pcpN, dpN or a concatenation in that order "
                         "(tp2pp2)")
    tp, pp, dcp, pcp, dp = (int(group or 1) for group in match.groups())
    return tp, pp, dcp, pcp, dp


def collective_seconds(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    match = re.search(r"^rapid_llm:collective_seconds_total\{[^}]*\} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def layout_server(args: argparse.Namespace, tp: int, pp: int, dcp: int, pcp: int, dp: int,
                  log: Path) -> ServerProcess:
    """`launch_server` at one layout on `args.port`, healthy once returned."""
    flags = ["--model", args.model, "--tp", str(tp), "--pp", str(pp), "--dcp", str(dcp), "--pcp", str(pcp),
             "--dp", str(dp), "--log-level", "info", *args.server_args.split()]
    return ServerProcess(flags, args.port, log, args.startup_timeout)


def run_layout(args: argparse.Namespace, tp: int, pp: int, dcp: int, pcp: int, dp: int) -> dict[str, Any]:
    name = f"tp{tp}pp{pp}" + (f"dcp{dcp}" if dcp > 1 else "") + (f"pcp{pcp}" if pcp > 1 else "") + f"dp{dp}"
    server = layout_server(args, tp, pp, dcp, pcp, dp, Path(args.out).with_suffix(f".{name}.log"))
    try:
        # Warm up outside the measured window (the counter is read after it).
        for _ in range(2):
            httpx.post(f"{server.base_url}/v1/completions", timeout=120,
                       json={"prompt": [1] * args.input_len, "max_tokens": 8, "temperature": 0}).raise_for_status()
        before = collective_seconds(server.base_url)
        result = bench_serving.main([
            "--base-url", server.base_url, "--dataset-name", "random", "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.max_concurrency), "--temperature", "0", "--seed", "1",
            "--disable-tqdm"])
        collectives = collective_seconds(server.base_url) - before
        server_info = httpx.get(f"{server.base_url}/server_info", timeout=10).json()
    finally:
        server.close()
    duration = result["duration"]
    devices = tp * pp * pcp * dp
    return {"layout": name, "tp": tp, "pp": pp, "dcp": dcp, "pcp": pcp, "dp": dp, "devices": devices,
            "kv_cache_tokens": server_info.get("kv_cache_tokens"), "completed": result["completed"],
            "mean_ttft_ms": result["mean_ttft_ms"],
            "duration_s": duration, "output_throughput": result["output_throughput"],
            "tgs": result["output_throughput"] / devices, "collective_seconds": collectives,
            "collective_share": collectives / (duration * dp) if duration else 0.0,
            "cpu_threads_per_rank": server_info.get("cpu_threads"), "device": server_info.get("device")}


def table(rows: list[dict[str, Any]]) -> str:
    base = next((row["tgs"] for row in rows if row["devices"] == 1), None)
    lines = ["| layout | devices | threads/rank | output tok/s | TGS (tok/s/device) | efficiency vs 1 rank | "
             "collective s (reporting rank) | share of run | mean TTFT ms |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        efficiency = f"{row['tgs'] / base:.2f}" if base else "n/a"
        lines.append(f"| {row['layout']} | {row['devices']} | {row['cpu_threads_per_rank'] or '-'} | "
                     f"{row['output_throughput']:.1f} | {row['tgs']:.1f} | {efficiency} | "
                     f"{row['collective_seconds']:.2f} | {100 * row['collective_share']:.0f}% | "
                     f"{row['mean_ttft_ms']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--layouts", default="tp1,tp2,dp2",
                        help="Comma-separated tpN, ppN, dcpN, pcpN, dpN or concatenations (tp2dcp2).")
    parser.add_argument("--port", type=int, default=31777)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--server-args", default="", help="Extra launch_server flags, e.g. '--num-kv-blocks 512'.")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--out", default="benchmark-results/bench_parallel.json")
    args = parser.parse_args(argv)
    try:
        layouts = [parse_layout(text) for text in args.layouts.split(",")]
    except ValueError as error:
        parser.error(str(error))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = [run_layout(args, *layout) for layout in layouts]
    print(table(rows))
    Path(args.out).write_text(json.dumps({"rows": rows, "environment": collect_environment(None),
                                          "args": vars(args)}, indent=2) + "\n")
    print(f"Result saved to {args.out}")
    return rows


if __name__ == "__main__":
    main()
