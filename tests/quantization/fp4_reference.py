"""FP4 checkpoints written from known tensors (or by compressed-tensors), and the dequantize-then-matmul reference.

Independent of rapid_llm/quantization/fp4_math.py: e2m1 codes come from a nearest-value search over the table,
NVFP4 in the compressed-tensors layout is produced and dequantized by the compressed_tensors library itself
(its CPU quantize/pack/unpack), and W4A4 activations are fake-quantized with that library's `fake_quantize`.
Each writer copies a tiny bf16/fp32 checkpoint, replaces its Llama linear weights with one layout's tensors
and returns the dequantized fp32 weights (plus static input scales) for `reference_model`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from tests.quantization.fp8_reference import LINEAR_NAMES, _linear_module

TABLE = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
SIBLINGS = {"q_proj": ("q_proj", "k_proj", "v_proj"), "k_proj": ("q_proj", "k_proj", "v_proj"),
            "v_proj": ("q_proj", "k_proj", "v_proj"), "gate_proj": ("gate_proj", "up_proj"),
            "up_proj": ("gate_proj", "up_proj")}


def nearest_codes(values: torch.Tensor) -> torch.Tensor:
    """Index of the nearest table value (the first on a tie), as uint8."""
    return (values.float().unsqueeze(-1) - TABLE).abs().argmin(dim=-1).to(torch.uint8)


def pack(codes: torch.Tensor) -> torch.Tensor:
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def decode(packed: torch.Tensor) -> torch.Tensor:
    out = torch.empty(*packed.shape[:-1], packed.shape[-1] * 2)
    out[..., 0::2] = TABLE[(packed & 0xF).long()]
    out[..., 1::2] = TABLE[(packed >> 4).long()]
    return out


def modelopt_nvfp4(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """ModelOpt's NVFP4 tensors (weight, weight_scale, weight_scale_2) and the dequantized weight."""
    w = w.float()
    scale_2 = w.abs().max() / (448 * 6)
    groups = w.view(w.shape[0], -1, 16)
    scale = (groups.abs().amax(-1) / 6 / scale_2).to(torch.float8_e4m3fn)
    step = scale.float().unsqueeze(-1) * scale_2
    codes = nearest_codes(groups / step).view(w.shape)
    packed = pack(codes)
    dequantized = (decode(packed).view(groups.shape) * step).view(w.shape)
    return {"weight": packed, "weight_scale": scale, "weight_scale_2": scale_2.reshape(())}, dequantized


def gpt_oss_mxfp4(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """gpt-oss's MXFP4 tensors (weight_blocks [out, in/32, 16], weight_scales e8m0) and the dequantized weight."""
    blocks = w.float().view(w.shape[0], -1, 32)
    exponent = torch.ceil(torch.log2(blocks.abs().amax(-1).clamp(min=1e-30) / 6))
    step = torch.exp2(exponent).unsqueeze(-1)
    packed = pack(nearest_codes(blocks / step))  # [out, in/32, 16]
    dequantized = (decode(packed) * step).view(w.shape)
    return {"weight_blocks": packed, "weight_scales": (exponent + 127).to(torch.uint8)}, dequantized


def compressed_tensors_nvfp4(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """compressed-tensors' NVFP4 tensors, produced and dequantized (in fp32) by the library."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    w = w.float()
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    global_scale = generate_gparam(w.min(), w.max())
    groups = w.view(w.shape[0], -1, 16)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights, global_scale=global_scale)
    tensors = NVFP4PackedCompressor.compress({"weight": w, "weight_scale": scale,
                                              "weight_global_scale": global_scale}, scheme)
    values = unpack_fp4_from_uint8(tensors["weight_packed"], w.shape[0], w.shape[1], dtype=torch.float32)
    step = tensors["weight_scale"].float().repeat_interleave(16, dim=1) / tensors["weight_global_scale"]
    return dict(tensors), values * step


def compressed_tensors_fake_quantize(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' W4A4 activation numerics: per token and 16 features, fp8 scales under the global."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    args = preset_name_to_scheme("NVFP4", ["Linear"]).input_activations
    flat = x.float().reshape(-1, x.shape[-1])
    groups = flat.view(flat.shape[0], -1, 16)
    scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=input_global_scale)
    out = fake_quantize(flat, scale.float(), zero, args, global_scale=input_global_scale)
    return out.view(x.shape).to(x.dtype)


def write_checkpoint(source: Path, target: Path, quantize: Callable[[torch.Tensor], tuple[dict, torch.Tensor]],
                     quantization_config: dict, input_scales: str | None = None,
                     keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Copy `source` to `target` with every Llama linear weight (but `keep`) replaced by `quantize`'s tensors;
    `input_scales` names a per-matrix static input scale to add ("input_scale": amax / 2688 as ModelOpt writes it,
    "input_global_scale": its reciprocal as compressed-tensors does). Returns the dequantized weights by name
    and, per module, the dequantization-style input scale under `<module>.input_scale`."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors"))
    original = load_file(source / "model.safetensors")
    modules = {name: _linear_module(name) for name in original}
    tensors = {name: tensor for name, tensor in original.items() if modules[name] is None or modules[name] in keep}
    dequantized: dict[str, torch.Tensor] = {}
    generator = torch.Generator().manual_seed(0)
    for name, module in modules.items():
        if name in tensors:
            continue
        tensor = original[name]
        quantized, dequantized[name] = quantize(tensor)
        tensors.update({f"{module}.{key}": value.contiguous() for key, value in quantized.items()})
        if input_scales is not None:  # a calibrated-looking amax of a few units
            scale = torch.tensor((2.0 + torch.rand((), generator=generator).item()) / (448 * 6))
            tensors[f"{module}.{input_scales}"] = (scale if input_scales == "input_scale" else 1 / scale).reshape(1)
            dequantized[f"{module}.input_scale"] = scale
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return dequantized


def merged_input_scale(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The input scale a merged layer uses: the largest of its matrices' (every engine's one input quantization)."""
    prefix, leaf = name.rsplit(".", 1)
    return max(weights[f"{prefix}.{sibling}.input_scale"] for sibling in SIBLINGS.get(leaf, (leaf,)))


def add_w4a4_hooks(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Fake-quantize each quantized linear layer's input as compressed-tensors' NVFP4 W4A4 does."""
    for name, module in model.named_modules():
        if name.split(".")[-1] in LINEAR_NAMES and f"{name}.weight" in weights:
            global_scale = (1 / merged_input_scale(weights, name)).reshape(1)
            module.register_forward_pre_hook(
                lambda _, args, g=global_scale: (compressed_tensors_fake_quantize(args[0], g),))
