"""FP8 checkpoints written from known tensors, and the dequantize-then-matmul transformers reference.

Written independently of rapid_llm/quantization (loops over tiles, its own activation fake-quantization), so a
shared mistake cannot hide: a tiny Llama checkpoint's linear weights become e4m3 + scales in the layout DeepSeek
and Qwen3-FP8 (quant_method fp8) or fbgemm_fp8 write, and the reference is the transformers model with the
dequantized weights and a pre-hook fake-quantizing each linear layer's input as the config says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

E4M3 = torch.float8_e4m3fn
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Format:
    """One FP8 weight format: how scales are laid out and how activations are quantized."""

    granularity: str  # "tensor", "row" or "block"
    block: tuple[int, int] | None = None
    ue8m0: bool = False
    static: bool = False

    def quantization_config(self) -> dict:
        if self.granularity == "row":
            return {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}
        config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static" if self.static else "dynamic"}
        if self.block is not None:
            config["weight_block_size"] = list(self.block)
        if self.ue8m0:
            config["scale_fmt"] = "ue8m0"
        return config


def _scale(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    scale = amax.float().clamp(min=1e-12) / 448.0
    return 2.0 ** torch.ceil(torch.log2(scale)) if ue8m0 else scale


def quantize(w: torch.Tensor, fmt: Format) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, scales in the checkpoint's shape), tile by tile."""
    w = w.float()
    if fmt.granularity == "tensor":
        scale = _scale(w.abs().max(), fmt.ue8m0)
        return (w / scale).clamp(-448, 448).to(E4M3), scale.reshape(())
    if fmt.granularity == "row":
        scale = _scale(w.abs().amax(dim=1, keepdim=True), fmt.ue8m0)
        return (w / scale).clamp(-448, 448).to(E4M3), scale
    bn, bk = fmt.block
    tiles = torch.empty(-(-w.shape[0] // bn), -(-w.shape[1] // bk))
    q = torch.empty(w.shape, dtype=E4M3)
    for i in range(tiles.shape[0]):
        for j in range(tiles.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]
            tiles[i, j] = _scale(tile.abs().max(), fmt.ue8m0)
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (tile / tiles[i, j]).clamp(-448, 448).to(E4M3)
    return q, tiles


def dequantize(q: torch.Tensor, scale: torch.Tensor, fmt: Format) -> torch.Tensor:
    w = q.float()
    if fmt.granularity != "block":
        return w * scale
    bn, bk = fmt.block
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] *= scale[i, j]
    return w


def fake_quantize_input(x: torch.Tensor, fmt: Format, input_scale: torch.Tensor | None) -> torch.Tensor:
    """What an FP8 kernel sees of x: static per-tensor, else per token (row formats) or per token and group of
    block_k features (block formats), with scales as the weights'."""
    if input_scale is not None:
        return ((x.float() / input_scale).clamp(-448, 448).to(E4M3).float() * input_scale).to(x.dtype)
    group = fmt.block[1] if fmt.block else x.shape[-1]
    out = torch.empty_like(x, dtype=torch.float32)
    for start in range(0, x.shape[-1], group):
        part = x[..., start:start + group].float()
        scale = _scale(part.abs().amax(dim=-1, keepdim=True), fmt.ue8m0)
        out[..., start:start + group] = (part / scale).clamp(-448, 448).to(E4M3).float() * scale
    return out.to(x.dtype)


def _linear_module(name: str) -> str | None:
    parts = name.split(".")
    return ".".join(parts[:-1]) if len(parts) > 1 and parts[-2] in LINEAR_NAMES and parts[-1] == "weight" else None


def write_fp8_checkpoint(source: Path, target: Path, fmt: Format, keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Copy `source` (a tiny bf16/fp32 checkpoint) to `target` with FP8 linear weights (except the modules in
    `keep`, listed as ignored_layers); returns the dequantized weights (fp32) by name, and per module the static
    input scale (for the reference)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.suffix != ".safetensors" and path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    tensors, dequantized = {}, {}
    generator = torch.Generator().manual_seed(0)
    for name, tensor in load_file(source / "model.safetensors").items():
        module = _linear_module(name)
        if module is None or module in keep:
            tensors[name] = tensor
            continue
        q, scale = quantize(tensor, fmt)
        tensors[name] = q
        tensors[f"{module}.{'weight_scale_inv' if fmt.block else 'weight_scale'}"] = scale
        dequantized[name] = dequantize(q, scale, fmt)
        if fmt.static:  # a calibrated-looking scale: activations here reach a few units
            input_scale = torch.tensor(2.0 + torch.rand((), generator=generator).item()) / 448
            tensors[f"{module}.input_scale"] = input_scale
            dequantized[f"{module}.input_scale"] = input_scale
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = fmt.quantization_config()
    if keep:
        config["quantization_config"]["ignored_layers"] = list(keep)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return dequantized


def reference_model(source: Path, weights: dict[str, torch.Tensor],
                    fmt: Format | None) -> transformers.PreTrainedModel:
    """The fp32 transformers model of `source` with `weights` (dequantized) loaded, the input of each linear
    layer `weights` holds fake-quantized as `fmt` says (None: weights only). A static layer merged with others (q/k/v, gate/up) uses
    the largest of their input scales, as every engine with one input quantization per merged GEMM does."""
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    model.load_state_dict({name: w for name, w in weights.items() if not name.endswith("input_scale")}, strict=False)
    if fmt is None:
        return model
    for name, module in model.named_modules():
        if f"{name}.weight" not in weights:
            continue
        input_scale = None
        if fmt.static:
            siblings = {"q_proj": ("q_proj", "k_proj", "v_proj"), "k_proj": ("q_proj", "k_proj", "v_proj"),
                        "v_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj"),
                        "up_proj": ("gate_proj", "up_proj")}.get(name.split(".")[-1], (name.split(".")[-1],))
            prefix = name.rsplit(".", 1)[0]
            input_scale = max(weights[f"{prefix}.{sibling}.input_scale"] for sibling in siblings)
        module.register_forward_pre_hook(lambda _, args, s=input_scale: (fake_quantize_input(args[0], fmt, s),))
    return model
