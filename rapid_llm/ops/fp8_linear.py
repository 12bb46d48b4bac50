"""The `fp8_linear` op: y = fake_quant(x) @ dequant(W)ᵀ + b over an FP8 e4m3 weight and its scales.

`weight` is fp8 [out, in]; `weight_scale` is fp32 [out, 1] (per row; per-tensor formats are expanded to rows
when the weights are prepared) or [ceil(out / bn), ceil(in / bk)] tile scales when `spec.block` is set. The
activations are quantized to fp8 and back as the spec says (W8A8 numerics; `input_scale` for static ones).
torch_ref dequantizes the whole weight on every call and runs F.linear in the activation dtype: the
correctness oracle, not a fast path (an fp8 GEMM kernel would take its place on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rapid_llm.quantization.fp8_math import dequantize_weight, fake_quantize_activation


@dataclass(frozen=True)
class Fp8LinearSpec:
    block: tuple[int, int] | None  # tile of the weight scales; None: one scale per row
    static_activation: bool  # quantize x with `input_scale`, else dynamically per token (or token group)
    activation_group: int | None = None  # features per dynamic activation scale (None: the whole token)
    ue8m0: bool = False  # dynamic activation scales rounded up to powers of two, like the weights'
    activation_amax_bound: float | None = None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None,
               spec: Fp8LinearSpec, bias: torch.Tensor | None = None) -> torch.Tensor:
    w = dequantize_weight(weight, weight_scale, spec.block, x.dtype)
    x = fake_quantize_activation(x, spec.activation_group, input_scale if spec.static_activation else None,
                                 spec.ue8m0, spec.activation_amax_bound)
    return F.linear(x, w, bias)
