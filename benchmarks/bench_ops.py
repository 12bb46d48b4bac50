"""Times every op x every implementation whose conditions hold on this machine, at serving shapes.

    python benchmarks/bench_ops.py --model-shape llama-10m --num-tokens 1,8,128,512 --dtype bf16 --json ops.json

Key design choice: nothing here names an implementation. Inputs are the op cases of rapid_llm/ops/op_cases.py
(the numerics test's), implementations come from the registry (`REGISTRY.implementation` per backend), so
whatever anyone registers is timed, and one whose conditions fail is listed with the registry's reason. A row
is the median of --iters calls (each synchronised on CUDA) after --warmup; "x ref" is torch_ref's median over
the row's (2.0 = twice as fast) and `*` marks what dispatch picks for that call (`REGISTRY.select`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from rapid_llm.config.dtypes import dtype_from_name, dtype_name
from rapid_llm.ops import REGISTRY, catalog
from rapid_llm.ops.op_case_inputs import SHAPES, CaseConfig, ModelShape, OpCase
from rapid_llm.ops.op_cases import OP_CASES
from rapid_llm.ops.registry import NoImplementationError

SHAPE_FLAGS = {field.name: field.name.replace("_", "-") for field in dataclasses.fields(ModelShape)}


def _int_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default="llama-10m",
                        help="Preset shape; the flags below override its fields.")
    for name, flag in SHAPE_FLAGS.items():
        parser.add_argument(f"--{flag}", dest=name, type=int, default=None, help=f"Override the preset's {name}.")
    parser.add_argument("--num-tokens", type=_int_list, default=[1, 8, 128, 512],
                        help="Comma list: tokens per call (sampling: batch rows; attention decode: sequences).")
    parser.add_argument("--context-len", type=int, default=512, help="Cached tokens per sequence in attention.")
    parser.add_argument("--dtype", default="bf16", help="Comma list of fp32/bf16/fp16 (ops that take only "
                        "float32, like the sampling filter, run in float32).")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", default="", help="Comma list of OP or OP:VARIANT to run (default: all).")
    parser.add_argument("--iters", type=int, default=20, help="Timed calls per row.")
    parser.add_argument("--warmup", type=int, default=3, help="Untimed calls per row first.")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU).")
    parser.add_argument("--json", type=Path, default=None, help="Write every row and skip here.")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    unknown = {entry.split(":")[0] for entry in _names(args.ops)} - set(OP_CASES)
    if unknown:
        parser.error(f"--ops: unknown op(s) {sorted(unknown)}; ops: {', '.join(OP_CASES)}")
    return args


def _names(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _selected_cases(ops_flag: str) -> list[tuple[str, str, OpCase]]:
    """(op, variant, case) to run, in the registry's op order."""
    wanted = _names(ops_flag)
    return [(op, variant, OP_CASES[op]) for op in REGISTRY.backends() if op in OP_CASES
            for variant in OP_CASES[op].variants
            if not wanted or op in wanted or f"{op}:{variant}" in wanted]


def _median_us(run: Any, device: torch.device, iters: int, warmup: int) -> float:
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        run()
    synchronize()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def _picked(op: str, device: torch.device, dtype: str, args: tuple[Any, ...]) -> str:
    try:
        return REGISTRY.select(op, device, dtype, REGISTRY.call_shape(op, *args)).backend
    except NoImplementationError:
        return "none"


def bench_case(op: str, variant: str, case: OpCase, config: CaseConfig, iters: int,
               warmup: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, skips) of every implementation of `op` on one built call."""
    inputs = case.build(config, variant)
    dtype = dtype_name(config.dtype)
    where = {"op": op, "variant": variant, "dtype": dtype, "num_tokens": config.num_tokens}
    picked = _picked(op, config.device, dtype, inputs.args)
    rows, skips = [], []
    for backend in REGISTRY.backends()[op]:
        try:
            fn = REGISTRY.implementation(op, backend, config.device, dtype,
                                         REGISTRY.call_shape(op, *inputs.args)).fn
        except NoImplementationError as error:
            skips.append({**where, "backend": backend, "reason": str(error)})
            continue
        args = case.prepare(fn, inputs.args)
        median = _median_us(lambda: case.run(fn, args), config.device, iters, warmup)
        rows.append({**where, "backend": backend, "shape": inputs.label, "median_us": median,
                     "picked": backend == picked})
    reference = next((row["median_us"] for row in rows if row["backend"] == catalog.REFERENCE), None)
    for row in rows:
        row["vs_torch_ref"] = None if reference is None else reference / row["median_us"]
    return rows, skips


def print_table(rows: list[dict[str, Any]], skips: list[dict[str, Any]]) -> None:
    header = ("op", "variant", "backend", "dtype", "tokens", "shape", "median us", "x ref")
    lines = [(row["op"], row["variant"], row["backend"] + (" *" if row["picked"] else ""), row["dtype"],
              str(row["num_tokens"]), row["shape"], f"{row['median_us']:.1f}",
              "-" if row["vs_torch_ref"] is None else f"{row['vs_torch_ref']:.2f}") for row in rows]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    for line in [header, tuple("-" * width for width in widths), *lines]:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    print("* = what dispatch picks for that call")
    reasons = sorted({(skip["op"], skip["backend"], skip["dtype"], skip["reason"]) for skip in skips})
    for op, backend, dtype, reason in reasons:
        print(f"skipped {op} {backend} ({dtype}): {reason}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    overrides = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) is not None}
    shape = dataclasses.replace(SHAPES[args.model_shape], **overrides)
    device = torch.device(args.device)
    rows: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    dtypes = [dtype_name(name) for name in _names(args.dtype)]
    for op, variant, case in _selected_cases(args.ops):
        for dtype in dict.fromkeys(name if name in case.dtypes else case.dtypes[0] for name in dtypes):
            for tokens in args.num_tokens:
                config = CaseConfig(shape, tokens, dtype_from_name(dtype), device, args.context_len)
                case_rows, case_skips = bench_case(op, variant, case, config, args.iters, args.warmup)
                rows += case_rows
                skips += case_skips
    print_table(rows, skips)
    result = {"model_shape": args.model_shape, "shape": dataclasses.asdict(shape), "device": str(device),
              "context_len": args.context_len, "iters": args.iters, "warmup": args.warmup,
              "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows, "skipped": skips}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
