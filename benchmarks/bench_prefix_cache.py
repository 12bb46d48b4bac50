"""Prefix-cache configurations on the workloads the cache decides: multi-turn chat and shared system prompts, with a
working set several times the KV cache. Per configuration and workload: the prompt-token hit rate (/metrics) and
TTFT (median, p90, mean), in a JSON file, a markdown table and a plot. The hit rate counts the device's hits and
the offload tier's (external_prefix_cache_hits).

    python -m benchmarks.bench_prefix_cache --model demo-target --num-kv-blocks 192 --max-model-len 1024 \\
        --config hash="--prefix-cache-policy hash" --config radix="--prefix-cache-policy radix" --out DIR

Key design choice: one server per configuration, started here, and the same seeded workloads for all. A chat turn
appends the previous turn's real output ids (return_token_ids) and new user tokens to its conversation, so its
prompt is what the cache may hold plus the new part; conversations take their turns round-robin, so between two
turns of one the others pass through the cache. Every loop is bounded by the workload's request count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks.common.environment import collect_environment, fetch_server_info
from benchmarks.common.server_process import ServerProcess
from benchmarks.metrics_sampler import parse_counters
from benchmarks.plots import pyplot

COUNTERS = ["rapid_llm:prefix_cache_queries_total", "rapid_llm:prefix_cache_hits_total",
            "rapid_llm:external_prefix_cache_hits_total"]
FIRST_TOKEN_ID = 10  # below: the demo tokenizer's special ids


async def complete(client: httpx.AsyncClient, prompt: list[int], output_len: int) -> tuple[float, list[int]]:
    """Stream one greedy completion of `prompt`: (seconds to its first token, its output ids)."""
    payload = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": True,
               "return_token_ids": True}
    start, ttft, ids = time.perf_counter(), None, []
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                if ttft is None and choice.get("token_ids"):
                    ttft = time.perf_counter() - start
                ids += choice.get("token_ids") or []
    return ttft or time.perf_counter() - start, ids


def tokens(rng: random.Random, count: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(count)]


async def multi_turn(client: httpx.AsyncClient, args: argparse.Namespace) -> list[float]:
    """`--conversations` chats of `--turns` turns, `--concurrency` conversations' turns at a time."""
    rng = random.Random(args.seed)
    histories = [tokens(rng, args.user_len, args.vocab) for _ in range(args.conversations)]
    ttfts: list[float] = []
    gate = asyncio.Semaphore(args.concurrency)

    async def turn(index: int) -> None:
        async with gate:
            ttft, output = await complete(client, histories[index], args.output_len)
        ttfts.append(ttft)
        histories[index] += output + tokens(rng, args.user_len, args.vocab)

    for _ in range(args.turns):
        await asyncio.gather(*(turn(index) for index in range(args.conversations)))
    return ttfts


async def shared_prefix(client: httpx.AsyncClient, args: argparse.Namespace) -> list[float]:
    """`--groups` system prompts of `--system-len` tokens, `--prompts-per-group` questions each, in a seeded shuffle."""
    rng = random.Random(args.seed)
    systems = [tokens(rng, args.system_len, args.vocab) for _ in range(args.groups)]
    prompts = [system + tokens(rng, args.user_len, args.vocab) for system in systems
               for _ in range(args.prompts_per_group)]
    rng.shuffle(prompts)
    gate = asyncio.Semaphore(args.concurrency)

    async def one(prompt: list[int]) -> float:
        async with gate:
            return (await complete(client, prompt, args.output_len))[0]

    return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))


WORKLOADS = {"multi-turn": multi_turn, "shared-prefix": shared_prefix}


def run_config(name: str, flags: list[str], args: argparse.Namespace) -> dict[str, Any]:
    server_flags = ["--model", args.model, "--num-kv-blocks", str(args.num_kv_blocks), "--max-model-len",
                    str(args.max_model_len), "--log-level", "warning", *flags]
    results: dict[str, Any] = {"flags": flags}
    with ServerProcess(server_flags, args.port, Path(args.out) / f"{name}.log") as server:
        results["server_info"] = fetch_server_info(server.base_url)
        for workload, run in WORKLOADS.items():
            httpx.post(f"{server.base_url}/flush_cache", timeout=30)
            before = parse_counters(httpx.get(f"{server.base_url}/metrics").text, COUNTERS)

            async def drive() -> list[float]:
                async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
                    return await run(client, args)

            start = time.perf_counter()
            ttfts = asyncio.run(drive())
            duration = time.perf_counter() - start
            after = parse_counters(httpx.get(f"{server.base_url}/metrics").text, COUNTERS)
            queries, device_hits, tier_hits = (after[c] - before[c] for c in COUNTERS)
            ttfts.sort()
            results[workload] = {
                "requests": len(ttfts), "duration_s": duration,
                "hit_rate": (device_hits + tier_hits) / queries if queries else 0.0,
                "tier_hit_rate": tier_hits / queries if queries else 0.0,
                "median_ttft_ms": 1000 * statistics.median(ttfts), "p90_ttft_ms": 1000 * ttfts[int(0.9 * len(ttfts))],
                "mean_ttft_ms": 1000 * statistics.fmean(ttfts)}
            print(f"{name:>16} {workload:>14}: {json.dumps(results[workload])}", flush=True)
    return results


def write_report(results: dict[str, dict[str, Any]], out: Path) -> None:
    lines = ["| configuration | workload | requests | hit rate (of it from the tier) | median TTFT ms | p90 TTFT ms | "
             "duration s |", "|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        for workload in WORKLOADS:
            row = result[workload]
            lines.append(f"| {name} | {workload} | {row['requests']} | {100 * row['hit_rate']:.1f} % "
                         f"({100 * row['tier_hit_rate']:.1f} %) | "
                         f"{row['median_ttft_ms']:.1f} | {row['p90_ttft_ms']:.1f} | {row['duration_s']:.1f} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    names = list(results)
    for axis, (key, label) in zip(axes, [("hit_rate", "prompt-token hit rate"), ("median_ttft_ms", "median TTFT (ms)")]):
        for offset, workload in enumerate(WORKLOADS):
            values = [results[name][workload][key] for name in names]
            axis.bar([i + 0.4 * offset for i in range(len(names))], values, width=0.4, label=workload)
        axis.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=30, ha="right")
        axis.set_title(label)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(out / "prefix_cache.png", dpi=120)


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo-target")
    parser.add_argument("--config", action="append", required=True, metavar="NAME=FLAGS",
                        help="A server configuration: a name and its launch_server flags (repeatable).")
    parser.add_argument("--num-kv-blocks", type=int, default=192)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=4000, help="Prompt token ids are drawn below this.")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prompts-per-group", type=int, default=6)
    parser.add_argument("--system-len", type=int, default=800)
    parser.add_argument("--user-len", type=int, default=96)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=31777)
    parser.add_argument("--out", default=f"benchmark-results/prefix-cache-policies-{time.strftime('%Y%m%d-%H%M%S')}")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for config in args.config:
        name, _, flags = config.partition("=")
        results[name] = run_config(name, flags.split(), args)
    environment = collect_environment(next(iter(results.values()))["server_info"])
    (out / "results.json").write_text(json.dumps({"args": vars(args), "environment": environment,
                                                  "results": results}, indent=2))
    write_report(results, out)
    return results


if __name__ == "__main__":
    main()
