"""Markdown tables for benchmarks/quantization_matrix.py, and the formats' memory arithmetic they check.

The expected weight bytes are computed from the bf16 checkpoint's tensor shapes and each format's definition
(bits per weight, scale dtype and group), not read back from the served model, so a mismatch with
/server_info's `weight_bytes` means the server stores something the format does not account for. The expected
KV capacity is the cache budget over the bytes of one block in the cache dtype, less the padding block.

  python benchmarks/quantization_matrix.py report --out DIR   # prints the tables
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from safetensors import safe_open

from rapid_llm.server_args import parse_size

ROOT = Path(__file__).resolve().parents[1]

FP8_ROWS = ("fp8", "fp8-rowwise", "fp8-block128", "fp8-block128-ue8m0", "fp8-block32", "fp8-block32-ue8m0")
BOUNDS = {**{row: ("FP8", 1.0) for row in FP8_ROWS}, "w4a16": ("W4A16", 2.0), "gptq-w4a16": ("W4A16", 2.0),
          "awq-w4a16": ("W4A16", 2.0), "nvfp4": ("FP4", 3.0), "mxfp4": ("FP4", 3.0)}
KV_LABELS = {"auto": "KV bf16", "fp8": "KV fp8", "nvfp4": "KV nvfp4"}


def _merged_linears(config: dict[str, Any]) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's dense linear layers, merged as the model builds them."""
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    attention = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim)]
    if _num_experts(config):
        return attention
    inter = config["intermediate_size"]
    return [*attention, (2 * inter, hidden), (hidden, inter)]


def _num_experts(config: dict[str, Any]) -> int:
    return config.get("num_local_experts") or config.get("num_experts") or 0


def _expert_bytes(row: str, config: dict[str, Any]) -> float:
    """One layer's experts: gate_up [2·I, H] and down [H, I] each; online int4 leaves them in bf16."""
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    expert_row = "bf16" if row in ("w4a16", "w4a8") else row
    # The MoE method keeps an online NVFP4 matrix's global scale as a parameter (the dense method does not).
    extra = 4 if row == "nvfp4" else 0
    per_expert = sum(_linear_bytes(expert_row, out, inp) + extra for out, inp in ((2 * inter, hidden), (hidden, inter)))
    return _num_experts(config) * per_expert


def _linear_bytes(row: str, out: int, inp: int) -> float:
    """Bytes of one merged [out, in] linear layer in a format (online quantization of the merged matrix)."""
    if row == "bf16":
        return 2 * out * inp
    if row == "fp8":
        return out * inp + 4  # one fp32 scale for the merged matrix
    if row == "fp8-rowwise":
        return out * inp + 4 * out
    if row.startswith("fp8-block"):
        block = 128 if row.startswith("fp8-block128") else 32
        return out * inp + 4 * math.ceil(out / block) * math.ceil(inp / block)
    if row in ("w4a16", "w4a8", "gptq-w4a16", "gptq-w4a8", "awq-w4a16", "awq-w4a8"):
        # cpu_int4pack: 4 bits a weight, a bf16 scale and zero per 128 inputs; GPTQ act-order adds the
        # permutation of the inputs (int64).
        perm = 8 * inp if row.startswith("gptq") else 0
        return out * inp / 2 + 2 * 2 * out * math.ceil(inp / 128) + perm
    if row == "nvfp4":
        return out * inp / 2 + out * inp / 16  # e2m1 nibbles + an fp8 scale per 16 (the global scale is a buffer)
    if row == "mxfp4":
        return out * inp / 2 + out * inp / 32  # e2m1 nibbles + an e8m0 scale per 32
    raise ValueError(f"no arithmetic for {row}")


def expected_weight_bytes(model: Path, row: str) -> int:
    config = json.loads((model / "config.json").read_text())
    with safe_open(str(model / "model.safetensors"), "pt") as tensors:
        total = sum(2 * math.prod(tensors.get_slice(k).get_shape()) for k in tensors.keys() if "_proj." not in k)
    per_layer = sum(_linear_bytes(row, out, inp) for out, inp in _merged_linears(config))
    if _num_experts(config):
        per_layer += _expert_bytes(row, config)
    return int(total + config["num_hidden_layers"] * per_layer)


def expected_kv_tokens(model: Path, kv: str, cache_bytes: int, block_size: int = 16) -> int:
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    row = {"auto": 2 * head_dim, "fp8": head_dim, "nvfp4": head_dim // 2 + head_dim // 16}[kv]
    block = block_size * config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * row
    return (cache_bytes // block - 1) * block_size  # one block is the padding block


def _row_order(row: str) -> tuple[int, str]:
    order = ["bf16", *FP8_ROWS, "w4a16", "gptq-w4a16", "awq-w4a16", "w4a8", "gptq-w4a8", "awq-w4a8", "nvfp4", "mxfp4"]
    return (order.index(row), row) if row in order else (len(order), row)


def _percent(ppl: float, base: float) -> str:
    return f"{round(100 * (ppl / base - 1), 2) + 0.0:+.2f} %"  # + 0.0: no "-0.00"


def _ppl(cell: dict[str, Any]) -> float | None:
    return cell.get("accuracy", {}).get("perplexity")


def _status(cell: dict[str, Any] | None) -> str | None:
    if cell is None:
        return "not run"
    if "unsupported" in cell:
        # The start-up error without the log line's time and process prefix.
        reason = cell["unsupported"].split("failed to start: ", 1)[-1]
        return f"unsupported: {reason}"
    if "error" in cell:
        return f"error: {cell['error']}"
    return None


def _grid(title: str, rows: list[str], kvs: list[str], cells: dict[tuple[str, str], dict[str, Any]],
          text: Callable[[dict[str, Any]], str]) -> list[str]:
    """A weight-mode x KV-dtype table: each cell its status (unsupported, failed) or `text(cell)`."""
    lines = [f"### {title}", "", "| weights | " + " | ".join(KV_LABELS[kv] for kv in kvs) + " |",
             "|---|" + "---|" * len(kvs)]
    for row in rows:
        entries = [_status(cells.get((row, kv))) or text(cells[(row, kv)]) for kv in kvs]
        lines.append(f"| {row} | " + " | ".join(entries) + " |")
    return lines


def _serving_text(cell: dict[str, Any]) -> str:
    serving = cell.get("serving", {})
    unlocked = "" if cell.get("serving_locked", True) else " (unlocked)"
    return (f"{serving['output_throughput']:.1f} tok/s, {serving['median_ttft_ms']:.0f} / "
            f"{serving['median_tpot_ms']:.0f}{unlocked}")


def render(cells: dict[tuple[str, str], dict[str, Any]]) -> str:
    rows = sorted(dict.fromkeys(row for row, _ in cells), key=_row_order)
    kvs = [kv for kv in KV_LABELS if any(k == kv for _, k in cells)]
    base = _ppl(cells.get(("bf16", "auto"), {}))

    def perplexity_text(cell: dict[str, Any]) -> str:
        ppl = _ppl(cell)
        return f"{ppl:.4f} ({_percent(ppl, base)})" if base else f"{ppl:.4f}"

    lines = _grid("Perplexity (Δ vs bf16 weights + bf16 KV)", rows, kvs, cells, perplexity_text)
    lines += ["", *_grid("Speed: decode tok/s, median TTFT / TPOT (ms)", rows, kvs, cells, _serving_text)]
    lines += ["", "### Memory: /server_info `weight_bytes` and `kv_cache_tokens` against the arithmetic", "",
              "| weights | KV | weight_bytes | expected | kv_cache_tokens | expected | match |",
              "|---|---|---|---|---|---|---|"]
    def order(item: tuple[tuple[str, str], Any]) -> tuple[tuple[int, str], int]:
        (row, kv), _ = item
        return _row_order(row), list(KV_LABELS).index(kv)

    for (row, kv), cell in sorted(cells.items(), key=order):
        info = cell.get("server_info")
        if info is None:
            lines.append(f"| {row} | {kv} | {_status(cell)} | — | — | — | — |")
            continue
        source = ROOT / cell["source_model"]  # the bf16 checkpoint the row was made from
        weights = expected_weight_bytes(source, row)
        tokens = expected_kv_tokens(source, kv, parse_size(cell["kv_cache_memory"], "--kv-cache-memory"))
        match = "yes" if (weights, tokens) == (info["weight_bytes"], info["kv_cache_tokens"]) else \
            f"no (weights {info['weight_bytes'] - weights:+,} B, tokens {info['kv_cache_tokens'] - tokens:+,})"
        lines.append(f"| {row} | {kv} | {info['weight_bytes']:,} | {weights:,} | {info['kv_cache_tokens']:,} | "
                     f"{tokens:,} | {match} |")
    lines += ["", "### Bounds check: Δ perplexity vs bf16 weights + bf16 KV", "",
              "| weights | bound | " + " | ".join(KV_LABELS[kv] for kv in kvs) + " | within the bound |",
              "|---|---|" + "---|" * (len(kvs) + 1)]
    for row in rows:
        kind, bound = BOUNDS.get(row, ("W4A8" if "w4a8" in row else "none", None))
        ppls = [_ppl(cells.get((row, kv), {})) for kv in kvs]
        deltas = [100 * (ppl / base - 1) if base and ppl else None for ppl in ppls]
        shown = ["—" if ppl is None or not base else _percent(ppl, base) for ppl in ppls]
        measured = [delta for delta in deltas if delta is not None]
        if bound is None:
            verdict = "no bound: stated"
        elif not measured:
            verdict = "not measured"
        else:
            verdict = "yes" if max(measured) <= bound else f"NO (worst {max(measured):+.2f} %)"
        lines.append(f"| {row} | {kind}{f' ≤ {bound} %' if bound else ''} | " + " | ".join(shown) + f" | {verdict} |")
    loads = [cell["load_average"][0] for cell in cells.values()]
    seconds = sum(cell["seconds"] for cell in cells.values())
    lines += ["", f"{len(cells)} cells, {seconds / 60:.0f} min of server time in all; 1-minute load average at the end "
              f"of each cell {min(loads):.1f} to {max(loads):.1f} (2 cores)."]
    return "\n".join(lines)
