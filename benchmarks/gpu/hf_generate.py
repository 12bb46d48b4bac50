"""The baseline a user would otherwise pick: transformers' own `generate` on the same checkpoint and GPU.

    python benchmarks/gpu/hf_generate.py --model DIR --input-len 128 --output-len 128 --json hf.json

Key design choice: measured as bench_latency.py measures rapid_llm (random prompt tokens, greedy, EOS
ignored, batch 1 by default): prefill = a run of one new token, decode step = (end-to-end - prefill) /
(output_len - 1), medians of CUDA-synchronised wall times, with transformers' default cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import transformers


def _timed(model: torch.nn.Module, input_ids: torch.Tensor, new_tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-iters", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.output_len < 2:
        parser.error("--output-len must be at least 2 (one prefill token plus decode steps)")
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (args.batch_size, args.input_len), generator=generator)
    input_ids = input_ids.to("cuda")
    with torch.inference_mode():
        _timed(model, input_ids, args.output_len)  # warm-up
        prefill = statistics.median(_timed(model, input_ids, 1) for _ in range(args.num_iters))
        end_to_end = statistics.median(_timed(model, input_ids, args.output_len) for _ in range(args.num_iters))
    result = {"transformers": transformers.__version__, "batch_size": args.batch_size, "input_len": args.input_len,
              "output_len": args.output_len, "prefill_ms": 1e3 * prefill, "end_to_end_ms": 1e3 * end_to_end,
              "decode_step_ms": 1e3 * (end_to_end - prefill) / (args.output_len - 1)}
    print(f"transformers generate: prefill {result['prefill_ms']:.2f} ms, decode step {result['decode_step_ms']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
