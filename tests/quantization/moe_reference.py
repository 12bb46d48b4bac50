"""Quantized MoE checkpoints written from known tensors, and the dequantize-then-matmul transformers reference.

Independent of rapid_llm/quantization: per-expert matrices (`experts.{e}.{gate,up,down}_proj.weight`, Mixtral's
`w1/w3/w2`) are quantized by the tests' own reference quantizers (fp8_reference.py, fp4_reference.py) into the
per-expert layout each format's checkpoints use (DeepSeek-V4: `ffn.experts.{e}.w1/w3/w2`), dense linear layers
optionally by another (mixed precision). The reference is the transformers fp32 model with the dequantized weights
loaded into its stacked experts (`mlp.experts.gate_up_proj` / `down_proj`) and, for W8A8 / W4A4 experts, an expert
loop (transformers' own, rewritten here) that fake-quantizes each expert GEMM's input.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import MethodType
from typing import Callable

import torch
import transformers
from safetensors.torch import load_file, save_file

from tests.quantization import fp8_reference
from tests.quantization.fp4_reference import gpt_oss_mxfp4
from tests.quantization.fp8_reference import Format, fake_quantize_input

EXPERT_MATRIX = re.compile(r"(?P<layer>.+)\.(?:mlp|block_sparse_moe|ffn)\.experts\.(?P<expert>\d+)\."
                           r"(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight")
ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
Quantizer = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]
# What an expert GEMM sees of its input x: activation(x, expert layer name, expert index, "gate_up" | "down").
Activation = Callable[[torch.Tensor, str, int, str], torch.Tensor]


def fp8_quantizer(fmt: Format) -> Quantizer:
    """DeepSeek / Qwen3-FP8 tensors of one matrix: `weight` e4m3 and `weight_scale_inv` (block) or `weight_scale`."""
    def quantize(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        q, scale = fp8_reference.quantize(w, fmt)
        return {"weight": q, "weight_scale_inv" if fmt.block else "weight_scale": scale}, \
            fp8_reference.dequantize(q, scale, fmt)
    return quantize


def deepseek_fp4(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """DeepSeek-V4's FP4 expert tensors: `weight` int8 [out, in/2], `weight_scale_inv` float8_e8m0fnu [out, in/32]."""
    tensors, dequantized = gpt_oss_mxfp4(w)
    scales = torch.exp2(tensors["weight_scales"].float() - 127).to(torch.float8_e8m0fnu)
    return {"weight": tensors["weight_blocks"].reshape(w.shape[0], -1).view(torch.int8),
            "weight_scale_inv": scales}, dequantized


def write_moe_checkpoint(source: Path, target: Path, experts: Quantizer, quantization_config: dict,
                         dense: Quantizer | None = None, keep: tuple[str, ...] = (),
                         input_scales: tuple[str, float] | None = None) -> dict[str, torch.Tensor]:
    """Copy `source` to `target` with every expert matrix quantized by `experts` and, if given, every dense linear
    weight by `dense`; names under a `keep` prefix stay. `input_scales` (name, format's max) adds a static
    per-matrix input scale (a calibrated-looking amax of a few units / max). Returns the dequantized fp32 weights
    by checkpoint name and each static scale under `<module>.input_scale`."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    tensors, dequantized = {}, {}
    generator = torch.Generator().manual_seed(0)
    for name, tensor in load_file(source / "model.safetensors").items():
        quantize = experts if EXPERT_MATRIX.fullmatch(name) else dense if fp8_reference._linear_module(name) else None
        if quantize is None or name.startswith(keep or ("\0",)):
            tensors[name] = tensor
            continue
        quantized, dequantized[name] = quantize(tensor)
        module = name.removesuffix(".weight")
        tensors.update({f"{module}.{key}": value.contiguous() for key, value in quantized.items()})
        if input_scales is not None:
            scale_name, fmt_max = input_scales
            scale = torch.tensor(2.0 + torch.rand((), generator=generator).item()) / fmt_max
            dequantized[f"{module}.input_scale"], tensors[f"{module}.{scale_name}"] = scale, scale.reshape(1)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return dequantized


def _fake_quantized_experts(activation: Activation, layer: str) -> Callable[..., torch.Tensor]:
    """transformers' stacked-experts forward with `activation` applied to the input of each expert GEMM."""
    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(hidden_states)
        for expert in range(self.gate_up_proj.shape[0]):
            token_idx, position = torch.where(top_k_index == expert)
            if token_idx.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(activation(hidden_states[token_idx], layer, expert, "gate_up"),
                                                  self.gate_up_proj[expert]).chunk(2, dim=-1)
            hidden = torch.nn.functional.linear(activation(self.act_fn(gate) * up, layer, expert, "down"),
                                                self.down_proj[expert])
            output.index_add_(0, token_idx, (hidden * top_k_weights[token_idx, position, None]).to(output.dtype))
        return output
    return forward


def reference_model(source: Path, weights: dict[str, torch.Tensor], dense_fmt: Format | None = None,
                    expert_activation: Activation | None = None,
                    ) -> transformers.PreTrainedModel:
    """The fp32 transformers model of `source` with `weights` (dequantized, by checkpoint name) loaded: dense ones
    with their inputs fake-quantized as `dense_fmt` says (fp8_reference), expert ones stacked into each layer's
    gate_up_proj / down_proj, every quantized expert GEMM's input passed through `expert_activation` when given."""
    dense = {name: w for name, w in weights.items()
             if not EXPERT_MATRIX.fullmatch(name.replace(".input_scale", ".weight"))}
    model = fp8_reference.reference_model(source, dense, dense_fmt)
    params, quantized = dict(model.named_parameters()), set()
    for name, w in weights.items():
        match = EXPERT_MATRIX.fullmatch(name)
        if match is None:
            continue
        prefix, expert, role = f"{match['layer']}.mlp.experts", int(match["expert"]), ROLE[match["proj"]]
        quantized.add(prefix)
        if role == "down":
            params[f"{prefix}.down_proj"].data[expert] = w
        else:
            rows = w.shape[0]
            params[f"{prefix}.gate_up_proj"].data[expert, (0 if role == "gate" else rows):][:rows] = w
    if expert_activation is not None:
        for name, module in model.named_modules():
            if name in quantized:
                module.forward = MethodType(_fake_quantized_experts(expert_activation, name), module)
    return model


def fp8_activation(fmt: Format) -> Activation:
    """What a dynamic W8A8 FP8 GEMM sees of its input (per token, or per token and block_k features)."""
    return lambda x, layer, expert, projection: fake_quantize_input(x, fmt, None)


def expert_input_scale(weights: dict[str, torch.Tensor], layer: str, expert: int, projection: str) -> torch.Tensor:
    """The static input scale of one expert GEMM: down's, or the larger of gate's and up's (one input for both)."""
    matrices = ("down_proj",) if projection == "down" else ("gate_proj", "up_proj")
    return max(weights[f"{layer}.{expert}.{matrix}.input_scale"] for matrix in matrices)


def static_fp8_activation(fmt: Format, weights: dict[str, torch.Tensor]) -> Activation:
    return lambda x, layer, expert, projection: fake_quantize_input(
        x, fmt, expert_input_scale(weights, layer, expert, projection))
