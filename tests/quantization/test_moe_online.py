"""Online quantization of a model-dtype MoE model's experts (`--quantization fp8 | fp8-block32-ue8m0 | nvfp4 | mxfp4`)
gives the logits of transformers with the same weights quantized and dequantized (each expert's gate|up as one
matrix, as the method quantizes it), and the weight bytes the runner reports (/server_info's `weight_bytes`) are the
formats' arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file

from rapid_llm.quantization.fp4_math import mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize, nvfp4_quantize
from rapid_llm.quantization.fp8_math import dequantize_weight, quantize_weight
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from tests.quantization.fp8_reference import Format
from tests.quantization.moe_reference import EXPERT_MATRIX, fp8_activation, reference_model
from tests.quantization.test_fp4_checkpoints import WEIGHT_ONLY_ATOL
from tests.quantization.test_fp8_checkpoints import LOGIT_ATOL, _max_error, _runner
from tests.quantization.test_moe_checkpoints import QWEN3_MOE, SHAPES

# The checkpoint matrices one online-quantized weight holds (our merged layers and each expert's w13).
MERGED = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
          ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))
ROUND_TRIPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "fp8": lambda w: dequantize_weight(*quantize_weight(w, None), None, torch.float32),
    "fp8-block32-ue8m0": lambda w: dequantize_weight(*quantize_weight(w, (32, 32), True), (32, 32), torch.float32),
    "nvfp4": lambda w: nvfp4_dequantize(*nvfp4_quantize(w), torch.float32),
    "mxfp4": lambda w: mxfp4_dequantize(*mxfp4_quantize(w), torch.float32),
}
ACTIVATIONS = {"fp8": Format("row"), "fp8-block32-ue8m0": Format("block", (32, 32), ue8m0=True)}


def _groups(names: set[str]) -> list[list[str]]:
    """Checkpoint weight names grouped as the online methods quantize them together."""
    groups = []
    for name in sorted(names):
        match = EXPERT_MATRIX.fullmatch(name)
        if match is not None and match["proj"] in ("gate_proj", "down_proj"):
            prefix = name.rsplit(".", 2)[0]
            groups.append([f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"]
                          if match["proj"] == "gate_proj" else [name])
    for prefix in sorted({name.rsplit(".", 3)[0] for name in names if ".layers." in name}):
        for block, members in MERGED:
            group = [f"{prefix}.{block}.{member}.weight" for member in members]
            if all(member in names for member in group):
                groups.append(group)
    return groups


def _online_weights(source: Path, method: str) -> dict[str, torch.Tensor]:
    tensors = {name: t.float() for name, t in load_file(source / "model.safetensors").items()}
    weights = {}
    for group in _groups(set(tensors)):
        restored = ROUND_TRIPS[method](torch.cat([tensors[name] for name in group]))
        weights.update(zip(group, restored.split([tensors[name].shape[0] for name in group])))
    return weights


@pytest.mark.parametrize("method", list(ROUND_TRIPS))
def test_online_experts_match_dequantized_reference(tmp_path: Path, method: str) -> None:
    source = build_tiny_checkpoint(tmp_path, QWEN3_MOE, with_tokenizer=False, **SHAPES[32])
    runner = _runner(source, method)
    experts = runner.model.model.layers[0].mlp.experts
    assert experts.w13_weight.dtype == (torch.float8_e4m3fn if method.startswith("fp8") else torch.uint8)
    fmt = ACTIVATIONS.get(method)
    reference = reference_model(source, _online_weights(source, method), fmt, fmt and fp8_activation(fmt))
    error = _max_error(runner, reference)
    print(f"online {method}: max |logit error| {error:.2e}")
    assert error <= (LOGIT_ATOL if fmt else WEIGHT_ONLY_ATOL)


def _expert_bytes(method: str, rows: int, columns: int) -> int:
    """Bytes one expert matrix [rows, columns] is stored in (weights, scales) by `method`."""
    if method == "fp8-block32-ue8m0":
        return rows * columns + -(-rows // 32) * -(-columns // 32) * 4
    if method == "mxfp4":
        return rows * columns // 2 + rows * columns // 32
    return rows * columns // 2 + rows * columns // 16 + 4  # nvfp4: fp8 group scales and one fp32 global scale


@pytest.mark.parametrize("method", ["fp8-block32-ue8m0", "mxfp4", "nvfp4"])
def test_reported_weight_bytes_are_the_formats_arithmetic(tmp_path: Path, method: str) -> None:
    source = build_tiny_checkpoint(tmp_path, QWEN3_MOE, with_tokenizer=False, **SHAPES[32])
    plain, quantized = _runner(source), _runner(source, method)
    layers = [layer.mlp.experts for layer in quantized.model.model.layers if hasattr(layer.mlp, "experts")]
    e, h, i = layers[0].num_experts, layers[0].hidden_size, layers[0].intermediate_size
    expected = e * (_expert_bytes(method, 2 * i, h) + _expert_bytes(method, h, i))
    for experts in layers:
        assert sum(p.numel() * p.element_size() for p in experts.parameters()) == expected
    plain_experts = sum(p.numel() * p.element_size() for layer in plain.model.model.layers
                        if hasattr(layer.mlp, "experts") for p in layer.mlp.experts.parameters())
    dense_change = plain.weight_bytes - quantized.weight_bytes - (plain_experts - expected * len(layers))
    assert plain_experts == len(layers) * e * 3 * h * i * 4  # fp32
    assert dense_change > 0  # the dense linear layers are quantized too
    assert quantized.weight_bytes == sum(p.numel() * p.element_size() for p in quantized.model.parameters())
