"""Latency of one fixed batch: prefill, per-step decode and end-to-end, as `vllm bench latency` measures.

    python benchmarks/bench_latency.py --model DIR --batch-size 8 --input-len 128 --output-len 64

Key design choice: each iteration submits `--batch-size` requests of exactly `--input-len` random
tokens together and forces `--output-len` new tokens (ignore EOS). Prefill latency is a run with
one output token; decode step latency is (end-to-end - prefill) / (output_len - 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.common.args import add_result_args
from benchmarks.common.engine_args import add_engine_args, engine_kwargs
from benchmarks.common.environment import collect_environment
from benchmarks.common.results import save_result

PERCENTILES = (10, 25, 50, 75, 90, 99)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True, help="Local Hugging Face checkpoint directory.")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-iters-warmup", type=int, default=2)
    parser.add_argument("--num-iters", type=int, default=10)
    add_result_args(parser)
    add_engine_args(parser)
    args = parser.parse_args(argv)
    if args.output_len < 2:
        parser.error("--output-len must be at least 2 (one prefill token plus decode steps)")
    return args


def _summary_ms(values_s: list[float]) -> dict[str, float]:
    """Mean and percentiles (numpy's linear interpolation, as vLLM) in milliseconds."""
    values_ms = 1000 * np.asarray(values_s)
    return {"avg_ms": float(values_ms.mean()),
            **{f"p{p}_ms": float(np.percentile(values_ms, p)) for p in PERCENTILES}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from rapid_llm import LLM, SamplingParams

    args = parse_args(argv)
    generator = torch.Generator().manual_seed(args.seed)
    with LLM(model=args.model, **engine_kwargs(args)) as llm:
        vocab = llm.config.model.vocab_size
        prompts = [torch.randint(0, vocab, (args.input_len,), generator=generator).tolist()
                   for _ in range(args.batch_size)]

        def timed(max_tokens: int) -> float:
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
            return time.perf_counter() - start

        for _ in range(args.num_iters_warmup):
            timed(args.output_len)
        prefill = [timed(1) for _ in range(args.num_iters)]
        end_to_end = [timed(args.output_len) for _ in range(args.num_iters)]
    decode_step = [(e - float(np.mean(prefill))) / (args.output_len - 1) for e in end_to_end]
    result = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "model_id": args.model,
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "avg_latency": float(np.mean(end_to_end)),
        "latencies": end_to_end,
        "percentiles": {str(p): float(np.percentile(end_to_end, p)) for p in PERCENTILES},
        "prefill_latency_ms": _summary_ms(prefill),
        "decode_step_latency_ms": _summary_ms(decode_step),
        "end_to_end_latency_ms": _summary_ms(end_to_end),
        "environment": collect_environment(None),
    }
    for name in ("prefill", "decode_step", "end_to_end"):
        stats = result[f"{name}_latency_ms"]
        print(f"{name.replace('_', ' ')} latency: avg {stats['avg_ms']:.2f} ms, p50 {stats['p50_ms']:.2f} ms, "
              f"p99 {stats['p99_ms']:.2f} ms")
    print(f"Avg latency: {result['avg_latency']:.4f} seconds")
    save_result(result, args, f"latency-bs{args.batch_size}-{result['date']}")
    return result


if __name__ == "__main__":
    main()
