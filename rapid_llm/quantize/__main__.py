"""CLI: python -m rapid_llm.quantize --model DIR --method gptq|awq --out DIR [options].

Loads the checkpoint in transformers (fp32, CPU), draws calibration windows (calibration.py), quantizes every
decoder layer (layerwise.py) and writes a GPTQ v1 or AWQ GEMM checkpoint whose `quantization_config.meta`
records the quantizer, dataset, sample count and window length. `--w4a8` sets `activation_bits: 8`, which
rapid_llm reads as int8 per-token activations (the weights are the same).
Usage: python -m rapid_llm.quantize --model demo-target --method gptq --group-size 128 --desc-act --out /tmp/q
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
import transformers

from rapid_llm.quantize.calibration import DEMO_TRAIN, calibration_samples
from rapid_llm.quantize.checkpoint import write_checkpoint
from rapid_llm.quantize.layerwise import Settings, quantize_layers
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo

logger = logging.getLogger("rapid_llm.quantize")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rapid_llm.quantize", description="GPTQ or AWQ int4 "
                                     "quantization of a checkpoint, calibrated on local text; writes a checkpoint "
                                     "rapid_llm loads.")
    parser.add_argument("--model", required=True, help="Checkpoint directory or demo model name (demo-target, ...).")
    parser.add_argument("--method", required=True, choices=["gptq", "awq"])
    parser.add_argument("--bits", type=int, default=4, choices=[4], help="Weight bits (only 4).")
    parser.add_argument("--group-size", type=int, default=128, help="Input channels per scale; -1: per channel.")
    parser.add_argument("--sym", action=argparse.BooleanOptionalAction, default=True,
                        help="GPTQ: symmetric grid, zero point 8 (default; --no-sym: a zero per group). AWQ is "
                             "always asymmetric.")
    parser.add_argument("--desc-act", action="store_true", help="GPTQ act-order: columns by decreasing Hessian "
                        "diagonal (g_idx in the checkpoint).")
    parser.add_argument("--damp", type=float, default=0.01, help="GPTQ damping, a fraction of mean(diag H).")
    parser.add_argument("--w4a8", action="store_true", help="Mark the checkpoint W4A8 (activation_bits 8).")
    parser.add_argument("--dataset", default=DEMO_TRAIN, help=f"{DEMO_TRAIN} (the demo models' training text) "
                        "or a local text file.")
    parser.add_argument("--num-samples", type=int, default=128, help="Calibration windows.")
    parser.add_argument("--seq-len", type=int, default=512, help="Tokens per calibration window.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="Output checkpoint directory.")
    return parser


def quantization_config(args: argparse.Namespace, dataset: str) -> dict:
    meta = {"quantizer": "rapid_llm.quantize", "dataset": dataset, "num_samples": args.num_samples,
            "seq_len": args.seq_len, "seed": args.seed}
    config = {"quant_method": args.method, "bits": 4, "group_size": args.group_size}
    if args.method == "gptq":
        config.update(sym=args.sym, desc_act=args.desc_act, checkpoint_format="gptq", damp_percent=args.damp)
    else:
        config.update(zero_point=True, version="gemm")
    if args.w4a8:
        config["activation_bits"] = 8
    return {**config, "meta": meta}


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.method == "awq" and args.desc_act:
        raise SystemExit("--desc-act is a GPTQ option; AWQ groups are contiguous")
    if args.group_size != -1 and (args.group_size <= 0 or args.group_size % 8):
        raise SystemExit(f"--group-size must be -1 or a positive multiple of 8, got {args.group_size}")
    source = Path(model_dir_or_demo(args.model))
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    samples, dataset = calibration_samples(args.dataset, tokenizer, args.num_samples, args.seq_len, args.seed)
    logger.info("calibration: %d windows of %d tokens from %s", args.num_samples, args.seq_len, dataset)
    saved = json.loads((source / "config.json").read_text())
    dtype = getattr(torch, saved.get("dtype") or saved.get("torch_dtype") or "bfloat16")  # the source's, to write
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    settings = Settings(args.method, args.group_size, args.sym and args.method == "gptq", args.desc_act, args.damp)
    tensors = quantize_layers(model, samples, settings)
    write_checkpoint(model, tensors, source, Path(args.out), dtype, quantization_config(args, dataset))
    logger.info("wrote %s (%d linear layers, %.1f s)", args.out, len(tensors), time.perf_counter() - start)


if __name__ == "__main__":
    main()
