"""The `fp4_linear` op: y = act(x) @ dequant(W)ᵀ + b over packed FP4 (e2m1) weights and their group scales.

`weight` is uint8 [out, in/2] (two codes per byte, even element in the low nibble). NVFP4: `weight_scale` fp8
e4m3 [out, in/16] and `weight_global` fp32 broadcast against [out, 1] (one per row or per tensor); MXFP4:
`weight_scale` uint8 e8m0 [out, in/32], no global scale. `spec.activation` "none" is weight only (W4A16);
"nvfp4" fake-quantizes x to NVFP4 under `input_global` (W4A4 numerics, up to summation order).
torch_ref dequantizes the whole weight on every call and runs F.linear in the activation dtype: the
correctness oracle (an FP4 GEMM kernel would take its place on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rapid_llm.quantization.fp4_math import mxfp4_dequantize, nvfp4_dequantize, nvfp4_fake_quantize


@dataclass(frozen=True)
class Fp4LinearSpec:
    fmt: str  # "nvfp4" or "mxfp4"
    activation: str = "none"  # "none" (weight only) or "nvfp4" (W4A4)


def dequantize_fp4_weight(weight: torch.Tensor, weight_scale: torch.Tensor, weight_global: torch.Tensor | None,
                          spec: Fp4LinearSpec, dtype: torch.dtype) -> torch.Tensor:
    if spec.fmt == "nvfp4":
        return nvfp4_dequantize(weight, weight_scale, weight_global, dtype)
    return mxfp4_dequantize(weight, weight_scale, dtype)


def fp4_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_global: torch.Tensor | None,
               input_global: torch.Tensor | None, spec: Fp4LinearSpec, bias: torch.Tensor | None = None) -> torch.Tensor:
    w = dequantize_fp4_weight(weight, weight_scale, weight_global, spec, x.dtype)
    if spec.activation == "nvfp4":
        x = nvfp4_fake_quantize(x, input_global)
    return F.linear(x, w, bias)
