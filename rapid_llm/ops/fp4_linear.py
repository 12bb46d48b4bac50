"""The `fp4_linear` op: y = act(x) @ dequant(W)ᵀ + b over packed FP4 (e2m1) weights and their group scales.

`weight` is uint8 [out, in/2] (two codes per byte, even element in the low nibble). NVFP4: `weight_scale` fp8
e4m3 [out, in/16] and `weight_global` fp32 broadcast against [out, 1] (one per row or per tensor); MXFP4:
`weight_scale` uint8 e8m0 [out, in/32], no global scale. `spec.activation` "none" is weight only (W4A16);
"nvfp4" fake-quantizes x to NVFP4 under `input_global` (W4A4 numerics, up to summation order).
torch_ref dequantizes the whole weight on every call and runs F.linear in the activation dtype: the
correctness oracle. cpu_table is the same math with the e2m1 codes decoded by two `torch.take` gathers from a
16-entry table (low and high nibbles) instead of the byte -> pair table indexing, which CPU torch runs faster:
the same values, bit for bit. The Triton kernel (ops/triton/quant_fp4_gemm.py) takes their place on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rapid_llm.quantization.fp4_math import (FP4_VALUES, MXFP4_BLOCK, NVFP4_GROUP, e8m0_to_float, mxfp4_dequantize,
                                             nvfp4_dequantize, nvfp4_fake_quantize)


@dataclass(frozen=True)
class Fp4LinearSpec:
    fmt: str  # "nvfp4" or "mxfp4"
    activation: str = "none"  # "none" (weight only) or "nvfp4" (W4A4)


def dequantize_fp4_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_global: torch.Tensor | None,
                          spec: Fp4LinearSpec, dtype: torch.dtype) -> torch.Tensor:
    if spec.fmt == "nvfp4":
        return nvfp4_dequantize(weight, weight_scale, weight_global, dtype)
    return mxfp4_dequantize(weight, weight_scale, dtype)


def _linear(x: torch.Tensor, w: torch.Tensor, input_global: torch.Tensor | None, spec: Fp4LinearSpec,
            bias: torch.Tensor | None) -> torch.Tensor:
    if spec.activation == "nvfp4":
        x = nvfp4_fake_quantize(x, input_global)
    return F.linear(x, w, bias)


def fp4_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_global: torch.Tensor | None,
               input_global: torch.Tensor | None, spec: Fp4LinearSpec, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _linear(x, dequantize_fp4_weight(weight, weight_scale, weight_global, spec, x.dtype), input_global, spec,
                   bias)


_TABLES: dict[torch.device, torch.Tensor] = {}


def _decode(packed: torch.Tensor) -> torch.Tensor:
    """[..., n / 2] bytes -> [..., n] fp32 values (fp4_math.unpack_fp4's result)."""
    if packed.device not in _TABLES:
        _TABLES[packed.device] = torch.tensor(FP4_VALUES, dtype=torch.float32, device=packed.device)
    values = _TABLES[packed.device]
    low, high = torch.take(values, (packed & 0xF).long()), torch.take(values, (packed >> 4).long())
    return torch.stack((low, high), dim=-1).flatten(-2)


def fp4_linear_table(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     weight_global: torch.Tensor | None, input_global: torch.Tensor | None, spec: Fp4LinearSpec,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    nvfp4 = spec.fmt == "nvfp4"
    groups = _decode(weight).unflatten(-1, (-1, NVFP4_GROUP if nvfp4 else MXFP4_BLOCK))
    scales = weight_scale.float() if nvfp4 else e8m0_to_float(weight_scale)
    w = (groups * scales.unsqueeze(-1)).flatten(-2)  # the products and their order of fp4_math's dequantizers
    if nvfp4:
        w = w * weight_global.float()
    return _linear(x, w.to(x.dtype), input_global, spec, bias)
