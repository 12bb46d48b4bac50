"""GPTQ and AWQ checkpoints written from known tensors, and their dequantize-then-matmul transformers reference.

Independent of rapid_llm/quantization: groups are quantized in loops here, and the int32 words are built nibble
by nibble (GPTQ: word r of output n holds inputs 8r..8r+7, lowest nibble first; AWQ: word w of input k holds
outputs 8w + [0, 2, 4, 6, 1, 3, 5, 7], lowest nibble first), so a shared mistake in the packing cannot hide.
The reference is the fp32 transformers model with the dequantized weights, for W4A8 with a pre-hook that
quantizes each linear layer's input to int8 per token and back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Matrices that read the same input share an act-order permutation (their Hessians are the same).
SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
AWQ_NIBBLE_OUTPUT = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class Int4Format:
    layout: str  # "gptq" or "awq"
    group_size: int = 32  # -1: per output channel
    sym: bool = False
    desc_act: bool = False
    w4a8: bool = False

    def quantization_config(self) -> dict:
        config = {"quant_method": self.layout, "bits": 4, "group_size": self.group_size}
        if self.layout == "gptq":
            config.update(sym=self.sym, desc_act=self.desc_act, checkpoint_format="gptq")
        else:
            config.update(zero_point=True, version="gemm")
        if self.w4a8:
            config["activation_bits"] = 8
        return config


def _word(nibbles: list[int]) -> int:
    value = 0
    for position, nibble in enumerate(nibbles):
        value |= int(nibble) << (4 * position)
    return value - (1 << 32) if value >= 1 << 31 else value  # the int32 with those bits


def quantize_groups(w: torch.Tensor, groups: list[list[int]], sym: bool,
                    min_zero: int = 1) -> tuple[torch.Tensor, list]:
    """q [out, in] and per group (scale [out], zero [out]) for the input channels each group lists (zeros >= 1
    by default: GPTQ v1 stores zero - 1)."""
    q = torch.empty(w.shape, dtype=torch.int64)
    grids = []
    for channels in groups:
        part = w[:, channels].double()
        if sym:
            scale = (2 * part.abs().amax(dim=1) / 15).clamp(min=1e-8)
            zero = torch.full_like(scale, 8)
        else:
            low, high = part.amin(dim=1).clamp(max=0), part.amax(dim=1).clamp(min=0)
            scale = ((high - low) / 15).clamp(min=1e-8)
            zero = torch.round(-low / scale).clamp(min_zero, 15)
        q[:, channels] = (torch.round(part / scale[:, None]) + zero[:, None]).clamp(0, 15).long()
        grids.append((scale.float(), zero))
    return q, grids


def dequantize_groups(q: torch.Tensor, groups: list[list[int]], grids: list, fp16_scales: bool = True) -> torch.Tensor:
    """The fp32 weight; `fp16_scales`: with the scales rounded to fp16, as checkpoints store them."""
    w = torch.empty(q.shape)
    for channels, (scale, zero) in zip(groups, grids):
        scale = scale.half().float() if fp16_scales else scale
        w[:, channels] = (q[:, channels].float() - zero[:, None].float()) * scale[:, None]
    return w


def gptq_tensors(q: torch.Tensor, grids: list, g_idx: torch.Tensor) -> dict[str, torch.Tensor]:
    out_features, in_features = q.shape
    q = q.tolist()
    qweight = torch.tensor([[_word([q[n][8 * r + j] for j in range(8)]) for n in range(out_features)]
                            for r in range(in_features // 8)], dtype=torch.int32)
    qzeros = torch.tensor([[_word([int(zero[8 * c + j]) - 1 for j in range(8)]) for c in range(out_features // 8)]
                           for _, zero in grids], dtype=torch.int32)
    scales = torch.stack([scale for scale, _ in grids]).half()
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx.to(torch.int32)}


def awq_tensors(q: torch.Tensor, grids: list) -> dict[str, torch.Tensor]:
    out_features, in_features = q.shape
    q = q.tolist()
    qweight = torch.tensor([[_word([q[8 * c + AWQ_NIBBLE_OUTPUT[i]][k] for i in range(8)])
                             for c in range(out_features // 8)] for k in range(in_features)], dtype=torch.int32)
    qzeros = torch.tensor([[_word([int(zero[8 * c + AWQ_NIBBLE_OUTPUT[i]]) for i in range(8)])
                            for c in range(out_features // 8)] for _, zero in grids], dtype=torch.int32)
    return {"qweight": qweight, "qzeros": qzeros, "scales": torch.stack([scale for scale, _ in grids]).half()}


def _groups(in_features: int, fmt: Int4Format, order: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """Each group's input channels and g_idx: act-order groups take `order`'s channels in turn."""
    size = in_features if fmt.group_size == -1 else fmt.group_size
    channels = order if fmt.desc_act else torch.arange(in_features)
    groups = [channels[start:start + size].tolist() for start in range(0, in_features, size)]
    g_idx = torch.empty(in_features, dtype=torch.int64)
    for index, members in enumerate(groups):
        g_idx[members] = index
    return groups, g_idx


def write_int4_checkpoint(source: Path, target: Path, fmt: Int4Format,
                          keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Copy `source` to `target` with its linear layers in `fmt` (except the modules in `keep`, listed in
    modules_to_not_convert); returns the dequantized weights (fp32) by parameter name."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.suffix != ".safetensors" and path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    generator = torch.Generator().manual_seed(1)
    tensors, dequantized, orders = {}, {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        parts = name.split(".")
        module = ".".join(parts[:-1])
        if parts[-1] != "weight" or parts[-2] not in LINEAR_NAMES or module in keep:
            tensors[name] = tensor
            continue
        share = f"{'.'.join(parts[:-2])}.{SHARED_INPUT.get(parts[-2], parts[-2])}"
        order = orders.setdefault(share, torch.randperm(tensor.shape[1], generator=generator))
        groups, g_idx = _groups(tensor.shape[1], fmt, order)
        q, grids = quantize_groups(tensor.float(), groups, fmt.sym)
        packed = gptq_tensors(q, grids, g_idx) if fmt.layout == "gptq" else awq_tensors(q, grids)
        tensors.update({f"{module}.{key}": value for key, value in packed.items()})
        dequantized[name] = dequantize_groups(q, groups, grids)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = fmt.quantization_config()
    if keep:
        config["quantization_config"]["modules_to_not_convert"] = list(keep)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return dequantized


def fake_quantize_int8(x: torch.Tensor) -> torch.Tensor:
    scale = (x.float().abs().amax(dim=-1, keepdim=True) / 127).clamp(min=1e-10)
    return ((x.float() / scale).round().clamp(-127, 127) * scale).to(x.dtype)


def reference_model(source: Path, weights: dict[str, torch.Tensor], w4a8: bool) -> transformers.PreTrainedModel:
    """The fp32 transformers model of `source` with `weights` loaded (and int8 inputs where W4A8 quantizes)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    model.load_state_dict(weights, strict=False)
    if w4a8:
        for name, module in model.named_modules():
            if f"{name}.weight" in weights:
                module.register_forward_pre_hook(lambda _, args: (fake_quantize_int8(args[0]),))
    return model
