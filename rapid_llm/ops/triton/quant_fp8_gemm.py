"""The `fp8_linear` op in Triton: activations fake-quantized to fp8 (quant_activation.py), then the dequantize-GEMM
over the e4m3 weight (quant_gemm.py), the weight's scales applied per tile, row or tensor inside the kernel.

Same signature and numerics as the torch reference (rapid_llm/ops/fp8_linear.py), up to summation order.
Usage: registered as fp8_linear's "triton" backend (catalog.py); `fp8_linear(x, weight, scale, input_scale, spec)`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.fp8_linear import Fp8LinearSpec
from rapid_llm.ops.triton.quant_activation import fake_quantize_fp8
from rapid_llm.ops.triton.quant_gemm import FP8, dequant_gemm


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None,
               spec: Fp8LinearSpec, bias: torch.Tensor | None = None) -> torch.Tensor:
    (out_features, in_features), scale = weight.shape, weight_scale.float().contiguous()
    if x.shape[-1] != in_features:
        raise ValueError(f"fp8_linear: x has {x.shape[-1]} features, the weight {tuple(weight.shape)} takes "
                         f"{in_features}")
    if spec.block is not None:
        tiles = (_ceil(out_features, spec.block[0]), _ceil(in_features, spec.block[1]))
        if tuple(scale.shape) != tiles:
            raise ValueError(f"fp8_linear: block scales {tuple(scale.shape)} must be {tiles} for a "
                             f"{tuple(weight.shape)} weight in {spec.block} tiles")
        group_n, group_k, row_stride = spec.block[0], spec.block[1], scale.shape[1]
    elif scale.numel() == 1:
        group_n, group_k, row_stride = 1, in_features, 0
    elif tuple(scale.shape) == (out_features, 1):
        group_n, group_k, row_stride = 1, in_features, 1
    else:
        raise ValueError(f"fp8_linear: scales {tuple(scale.shape)} must be one per row [{out_features}, 1], one "
                         "for the tensor, or block tiles (spec.block)")
    x = fake_quantize_fp8(x, spec.activation_group, input_scale if spec.static_activation else None, spec.ue8m0,
                          spec.activation_amax_bound)
    return dequant_gemm(x, FP8, weight, out_features, scale, row_stride, group_n, group_k, bias)
