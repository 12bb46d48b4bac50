"""The `fp4_linear` op in Triton: NVFP4 (e4m3 scales per 16, times a per-row or per-tensor global) or MXFP4 (e8m0
per 32) weights read by the dequantize-GEMM (quant_gemm.py); W4A4 inputs fake-quantized to NVFP4 first.

Same signature and numerics as the torch reference (rapid_llm/ops/fp4_linear.py), up to summation order.
Usage: registered as fp4_linear's "triton" backend (catalog.py).
"""

from __future__ import annotations

import torch

from rapid_llm.ops.fp4_linear import Fp4LinearSpec
from rapid_llm.ops.triton.quant_activation import fake_quantize_nvfp4
from rapid_llm.ops.triton.quant_gemm import MXFP4, NVFP4, dequant_gemm
from rapid_llm.quantization.fp4_math import MXFP4_BLOCK, NVFP4_GROUP


def fp4_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_global: torch.Tensor | None,
               input_global: torch.Tensor | None, spec: Fp4LinearSpec,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    out_features, in_features = weight.shape[0], 2 * weight.shape[1]
    group = NVFP4_GROUP if spec.fmt == "nvfp4" else MXFP4_BLOCK
    if x.shape[-1] != in_features or tuple(weight_scale.shape) != (out_features, in_features // group):
        raise ValueError(f"fp4_linear: x has {x.shape[-1]} features, the packed weight {tuple(weight.shape)} holds "
                         f"{in_features}; {spec.fmt} scales {tuple(weight_scale.shape)} must be "
                         f"[{out_features}, {in_features // group}]")
    scale = weight_scale.contiguous()
    if spec.activation == "nvfp4":
        x = fake_quantize_nvfp4(x, input_global)
    if spec.fmt == "mxfp4":
        return dequant_gemm(x, MXFP4, weight, out_features, scale, scale.shape[1], 1, group, bias)
    if weight_global is None or weight_global.numel() not in (1, out_features):
        raise ValueError(f"fp4_linear: an NVFP4 weight needs a global scale per tensor or per row ({out_features})")
    global_scale = weight_global.float().reshape(-1).contiguous()
    return dequant_gemm(x, NVFP4, weight, out_features, scale, scale.shape[1], 1, group, bias, global_scale,
                        0 if global_scale.numel() == 1 else 1)
