"""Time and profile one worker step in isolation: ModelRunner.execute on a fixed batch, no server.

    python benchmarks/profile_step.py --model DIR --decodes 8 --context-len 160 [--prefills 1] \
        [--op-backend linear=torch_ref] [--threads 2] [--profile]

Key design choice: the batch is built as the scheduler would send it (decodes at `--context-len`,
optional fresh prefills of `--prefill-len` tokens), and the same step is executed repeatedly, so
the median is the step's own cost without IPC, scheduling or HTTP (compare with bench_serving.py's
TPOT to see those). The KV cache is filled with N(0, 1) values first, as a served cache holds written keys
and values: the runner allocates it with torch.empty, and pages nothing has written all map to the kernel's
one zero page, so decodes over them read cached zeros (4 llama-10m decodes at 2000 tokens: attention 116 us
a layer that way, 269 us filled). `--zero-kv` keeps it unwritten, as this script did before 2026-12-07.
`--profile` adds the torch profiler's per-op table; time the table does not account for is Python and
C++-extension calls (the profiler records ATen ops only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ops.registry import parse_op_backends
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner, ScheduledRequest

BLOCK_SIZE = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True, help="Local Hugging Face checkpoint directory.")
    parser.add_argument("--decodes", type=int, default=1, help="Sequences decoding one token each.")
    parser.add_argument("--context-len", type=int, default=160, help="Tokens each decode already holds.")
    parser.add_argument("--prefills", type=int, default=0, help="Fresh prompts prefilled in the same step.")
    parser.add_argument("--prefill-len", type=int, default=128)
    parser.add_argument("--op-backend", default=None, help="Pin ops, e.g. linear=torch_ref,attention=torch_ref.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's).")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="Print the torch profiler's per-op table.")
    parser.add_argument("--zero-kv", action="store_true", help="Leave the KV cache unwritten (see the module doc).")
    return parser.parse_args(argv)


def fill_kv_cache(runner: ModelRunner) -> None:
    """N(0, 1) keys and values in every block but the padding one (which stays zero, as the runner keeps it)."""
    generator = torch.Generator(device=runner.device).manual_seed(0)
    for layer in runner.kv_cache.layers:
        cache = layer.kv_cache
        cache.copy_(torch.randn(cache.shape, generator=generator, device=cache.device).to(cache.dtype))
    runner.kv_cache.clear_blocks([runner.padding_block])


def build_batch(runner: ModelRunner, args: argparse.Namespace) -> list[ScheduledRequest]:
    requests, next_block = [], 1
    lengths = [(args.context_len + 1, True)] * args.decodes + [(args.prefill_len, False)] * args.prefills
    for slot, (length, decoding) in enumerate(lengths):
        tokens = [(slot * 7919 + i) % runner.model_config.vocab_size for i in range(length)]
        runner.add_request(slot, tokens)
        blocks = list(range(next_block, next_block + -(-length // BLOCK_SIZE)))
        next_block += len(blocks)
        computed, new = (length - 1, 1) if decoding else (0, length)
        prompt = tokens[: min(length, args.prefill_len)] if decoding else tokens
        requests.append(ScheduledRequest(str(slot), slot, prompt, tokens[len(prompt):], computed, new, blocks,
                                         SamplingParams(temperature=0.0)))
    return requests


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    blocks_needed = (args.decodes + args.prefills) * -(-max(args.context_len + 1, args.prefill_len) // BLOCK_SIZE)
    runner = ModelRunner(ModelConfig.from_pretrained(args.model), CacheConfig(block_size=BLOCK_SIZE,
                         num_blocks=blocks_needed + 1), DeviceConfig("cpu"), parse_op_backends(args.op_backend),
                         max_num_seqs=args.decodes + args.prefills)
    if not args.zero_kv:
        fill_kv_cache(runner)
    batch = build_batch(runner, args)
    for _ in range(args.warmup):
        runner.execute(batch)
    times = []
    for _ in range(args.iters):
        start = time.perf_counter()
        runner.execute(batch)
        times.append(time.perf_counter() - start)
    median_ms = statistics.median(times) * 1e3
    ops = ", ".join(f"{name}={choice['backend']}" for name, choice in runner.op_choices.items())
    print(f"step: {args.decodes} decodes at {args.context_len} + {args.prefills} prefills of {args.prefill_len}, "
          f"{torch.get_num_threads()} threads: median {median_ms:.2f} ms\nops: {ops}")
    if args.profile:
        start = time.perf_counter()
        with torch.profiler.profile() as profiler:
            for _ in range(args.iters):
                runner.execute(batch)
        profiled_ms = (time.perf_counter() - start) * 1e3 / args.iters  # with the profiler's own overhead
        table = profiler.key_averages()
        aten_ms = sum(event.self_cpu_time_total for event in table) / 1e3 / args.iters
        print(table.table(sort_by="self_cpu_time_total", row_limit=20))
        print(f"ATen ops {aten_ms:.2f} ms of the {profiled_ms:.2f} ms profiled step; the rest is Python and "
              "C++-extension calls")
    return {"median_ms": median_ms}


if __name__ == "__main__":
    main()
