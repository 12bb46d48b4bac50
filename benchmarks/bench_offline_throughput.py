"""Offline throughput: every prompt handed to the engine at once, as `vllm bench throughput` does.

    python benchmarks/bench_offline_throughput.py --model DIR --dataset-name random \\
        --random-input-len 128 --random-output-len 64 --num-prompts 200
    python benchmarks/bench_offline_throughput.py --model DIR --backend hf ...   # transformers baseline

Key design choice: the rapid_llm backend drives `rapid_llm.LLM` (the same processes the server runs,
without HTTP); the hf backend runs the same prompts through transformers `generate` in batches, so
the two numbers differ only by the engine. Output length is forced (ignore EOS) in both.
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

from benchmarks.common.args import add_dataset_args, add_result_args
from benchmarks.common.datasets import SampleRequest, load_tokenizer, sample_requests
from benchmarks.common.engine_args import add_engine_args, engine_kwargs
from benchmarks.common.environment import collect_environment
from benchmarks.common.results import save_result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True, help="Local Hugging Face checkpoint directory.")
    parser.add_argument("--backend", choices=("rapid_llm", "hf"), default="rapid_llm")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 for greedy (as vLLM: default 1.0).")
    parser.add_argument("--hf-max-batch-size", type=int, default=8, help="Prompts per transformers generate call.")
    add_dataset_args(parser)
    add_result_args(parser)
    add_engine_args(parser)
    return parser.parse_args(argv)


def run_rapid_llm(args: argparse.Namespace, samples: list[SampleRequest]) -> float:
    from rapid_llm import LLM, SamplingParams

    params = [SamplingParams(temperature=args.temperature, max_tokens=s.expected_output_len, ignore_eos=True)
              for s in samples]
    with LLM(model=args.model, **engine_kwargs(args)) as llm:
        llm.generate([samples[0].prompt], SamplingParams(max_tokens=2))
        start = time.perf_counter()
        outputs = llm.generate([s.prompt for s in samples], params)
        elapsed = time.perf_counter() - start
    produced = [len(o.token_ids) for o in outputs]
    expected = [s.expected_output_len for s in samples]
    if produced != expected:
        raise RuntimeError("rapid_llm produced a different number of tokens than asked for")
    return elapsed


def run_hf(args: argparse.Namespace, samples: list[SampleRequest], tokenizer: Any) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto").eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    sampling = {"do_sample": False} if args.temperature == 0 else {"do_sample": True, "temperature": args.temperature}
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(samples), args.hf_max_batch_size):
            batch = samples[first : first + args.hf_max_batch_size]
            # A batch generates as long as its longest request, like vLLM's hf baseline.
            new_tokens = max(s.expected_output_len for s in batch)
            prompts = [s.prompt if isinstance(s.prompt, str) else tokenizer.decode(s.prompt) for s in batch]
            inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=tokenizer.pad_token_id, **sampling)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer or args.model)
    samples = sample_requests(args, tokenizer)
    elapsed = run_rapid_llm(args, samples) if args.backend == "rapid_llm" else run_hf(args, samples, tokenizer)
    input_tokens = sum(s.prompt_len for s in samples)
    output_tokens = sum(s.expected_output_len for s in samples)
    result = {
        "backend": args.backend,
        "model_id": args.model,
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "elapsed_time": elapsed,
        "num_requests": len(samples),
        "total_num_tokens": input_tokens + output_tokens,
        "total_output_tokens": output_tokens,
        "requests_per_second": len(samples) / elapsed,
        "tokens_per_second": (input_tokens + output_tokens) / elapsed,
        "output_tokens_per_second": output_tokens / elapsed,
        "environment": collect_environment(None),
    }
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, {result['tokens_per_second']:.2f} total "
          f"tokens/s, {result['output_tokens_per_second']:.2f} output tokens/s")
    print(f"Total num prompt tokens:  {input_tokens}\nTotal num output tokens:  {output_tokens}")
    save_result(result, args, f"offline-throughput-{args.backend}-{result['date']}")
    return result


if __name__ == "__main__":
    main()
