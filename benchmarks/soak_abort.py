"""A soak with client aborts: one server under CONCURRENCY streaming clients for DURATION seconds, every
ABORT_EVERY-th request dropped after its first chunks, and a verdict.

    python benchmarks/soak_abort.py --duration 600 --concurrency 32 --out DIR -- --model DIR --tp 2 \
        --enable-expert-parallel --enable-two-batch-overlap --dbo-prefill-token-threshold 64

The server (the arguments after `--`) is started here. Clients send greedy completions of a fixed pool of prompts
(random token ids, 16 to 512 tokens; `max_tokens` = `min_tokens`), streamed; an aborted one closes its stream after
`--abort-after` chunks. The run is cut into rounds of `--round-seconds`, each sampling the server's processes' RSS
(benchmarks/common/resources.py). Verdict (summary.json; exit 1 unless it passed): no request failed (an HTTP error,
a broken stream, or a completed one with another token count); after the clients stop the server reports no
running or waiting request (the aborted ones were freed); every process's mean RSS over the last third of the rounds
exceeds the first third's (round 1 left out: it warms caches) by at most `--max-growth-mib`. Reported, not judged:
how many completions of a prompt differed from its first (a batch's composition moves fp32 rounding, which can flip
a near tie).
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

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common.resources import ResourceSampler, server_pids  # noqa: E402
from benchmarks.common.server_process import ServerProcess  # noqa: E402

PORT = 31677


class Tally:
    def __init__(self) -> None:
        self.completed = self.aborted = 0
        self.failures: list[str] = []
        self.first_output: dict[int, list[int]] = {}
        self.changed = 0

    def completion(self, prompt: int, tokens: list[int], expected: int) -> None:
        if len(tokens) != expected:
            self.failures.append(f"prompt {prompt}: {len(tokens)} tokens, expected {expected}")
            return
        self.completed += 1
        first = self.first_output.setdefault(prompt, tokens)
        self.changed += first != tokens


async def one_request(client: httpx.AsyncClient, prompt_index: int, prompt: list[int], abort: bool,
                      args: argparse.Namespace, tally: Tally) -> None:
    body = {"prompt": prompt, "max_tokens": args.max_tokens, "min_tokens": args.max_tokens, "temperature": 0.0,
            "stream": True, "return_token_ids": True}
    tokens: list[int] = []
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                tally.failures.append(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                return
            chunks = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunks += 1
                tokens += json.loads(line[6:])["choices"][0].get("token_ids") or []
                if abort and chunks >= args.abort_after:
                    tally.aborted += 1
                    return  # leaving the block closes the stream: the server sees the client go
    except httpx.HTTPError as error:
        tally.failures.append(f"{type(error).__name__}: {error}")
        return
    tally.completion(prompt_index, tokens, args.max_tokens)


async def clients(args: argparse.Namespace, prompts: list[list[int]], until: float, tally: Tally,
                  counter: list[int]) -> None:
    async def client_loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < until:
            counter[0] += 1
            index = counter[0] % len(prompts)
            await one_request(client, index, prompts[index], counter[0] % args.abort_every == 0, args, tally)

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{PORT}", timeout=300) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(args.concurrency)))


def metric_values(names: tuple[str, ...]) -> dict[str, float]:
    """The server's /metrics values of `names` (rapid_llm:NAME, summed over labels)."""
    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=10).text
    return {name: sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"rapid_llm:{name}"))
            for name in names}


def idle_after(seconds: float) -> dict[str, float]:
    """The running and waiting gauges once they reach 0, or their values after `seconds`."""
    deadline, values = time.monotonic() + seconds, {}
    while time.monotonic() < deadline:
        values = metric_values(("num_requests_running", "num_requests_waiting"))
        if not any(values.values()):
            break
        time.sleep(1)
    return values


def flatness(rounds: list[dict[str, Any]], max_growth_mib: float) -> dict[str, Any]:
    per_process: dict[str, list[float]] = {}
    for item in rounds[1:]:
        for process in item["resources"].get("processes", []):
            per_process.setdefault(process["title"], []).append(process["rss_mib_mean"])
    growth = {}
    for title, series in per_process.items():
        third = max(1, len(series) // 3)
        growth[title] = statistics.mean(series[-third:]) - statistics.mean(series[:third])
    return {"growth_mib": growth, "flat": bool(growth) and max(growth.values()) <= max_growth_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--round-seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--abort-every", type=int, default=4)
    parser.add_argument("--abort-after", type=int, default=2, help="chunks an aborted request reads")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-growth-mib", type=float, default=32)
    parser.add_argument("--out", default="benchmark-results/soak-abort")
    parser.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: the server's flags")
    args = parser.parse_args()
    server_args = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    generator = random.Random(0)
    prompts = [[generator.randrange(10, 500) for _ in range(generator.randrange(16, 513))] for _ in range(64)]
    server = ServerProcess(["--log-level", "warning", *server_args], PORT, out / "server.log")
    try:
        roots, why = server_pids(port=PORT)
        tally, counter, rounds = Tally(), [0], []
        end = time.monotonic() + args.duration
        while time.monotonic() < end and server.process.poll() is None:
            sampler = ResourceSampler(roots, interval_s=2.0, unavailable=why)
            with sampler:
                asyncio.run(clients(args, prompts, min(end, time.monotonic() + args.round_seconds), tally, counter))
            rounds.append({"round": len(rounds) + 1, "completed": tally.completed, "aborted": tally.aborted,
                           "failed": len(tally.failures), "resources": sampler.summary()})
            print(f"round {len(rounds)}: {tally.completed} completed, {tally.aborted} aborted, "
                  f"{len(tally.failures)} failed so far", flush=True)
        alive = server.process.poll() is None
        left = idle_after(60) if alive else {}
        memory = flatness(rounds, args.max_growth_mib)
        passed = (alive and not tally.failures and not any(left.values()) and memory["flat"] and len(rounds) >= 3)
        summary = {"passed": passed, "server_alive": alive, "requests": counter[0], "completed": tally.completed,
                   "aborted": tally.aborted, "failed": len(tally.failures), "failures": tally.failures[:20],
                   "completions_differing_from_first": tally.changed, "left_in_server": left, "memory": memory,
                   "counters": metric_values(("two_batch_overlap_steps", "num_preemptions")) if alive else {},
                   "rounds": rounds, "server_args": server_args, "concurrency": args.concurrency,
                   "duration_s": args.duration}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps({key: summary[key] for key in ("passed", "requests", "completed", "aborted", "failed",
                                                        "completions_differing_from_first", "left_in_server",
                                                        "counters")}))
        print("memory growth (MiB, last third - first third):",
              {title[:40]: round(value, 1) for title, value in memory["growth_mib"].items()})
    finally:
        server.close()
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
