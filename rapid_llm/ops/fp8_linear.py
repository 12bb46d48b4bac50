"""The `fp8_linear` op: y = fake_quant(x) @ dequant(W)ᵀ + b over an FP8 e4m3 weight and its scales.

`weight` is fp8 [out, in]; `weight_scale` is fp32 [out, 1] (per row; per-tensor formats are expanded to rows
when the weights are prepared) or [ceil(out / bn), ceil(in / bk)] tile scales when `spec.block` is set. The
activations are quantized to fp8 and back as the spec says (W8A8 numerics; `input_scale` for static ones).
torch_ref dequantizes the whole weight on every call and runs F.linear in the activation dtype: the
correctness oracle. cpu_table is the same math with the fp8 -> fp32 decode done as a gather from a 256-entry
table (`torch.take`), which CPU torch runs 1.4-2x faster than the fp8 cast: the same values, bit for bit.
The Triton kernel (ops/triton/quant_fp8_gemm.py) takes its place on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rapid_llm.quantization.fp8_math import FP8_DTYPE, dequantize_weight, expand_block_scales, fake_quantize_activation


@dataclass(frozen=True)
class Fp8LinearSpec:
    block: tuple[int, int] | None  # tile of the weight scales; None: one scale per row
    static_activation: bool  # quantize x with `input_scale`, else dynamically per token (or token group)
    activation_group: int | None = None  # features per dynamic activation scale (None: the whole token)
    ue8m0: bool = False  # dynamic activation scales rounded up to powers of two, like the weights'
    activation_amax_bound: float | None = None


def _quantized_linear(x: torch.Tensor, w: torch.Tensor, input_scale: torch.Tensor | None, spec: Fp8LinearSpec,
                      bias: torch.Tensor | None) -> torch.Tensor:
    x = fake_quantize_activation(x, spec.activation_group, input_scale if spec.static_activation else None,
                                 spec.ue8m0, spec.activation_amax_bound)
    return F.linear(x, w, bias)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor | None,
               spec: Fp8LinearSpec, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _quantized_linear(x, dequantize_weight(weight, weight_scale, spec.block, x.dtype), input_scale, spec, bias)


_TABLES: dict[torch.device, torch.Tensor] = {}


def _values_of_bytes(device: torch.device) -> torch.Tensor:
    """[256] fp32: the e4m3 value of every byte (NaN for its two NaN codes)."""
    if device not in _TABLES:
        codes = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8)
        _TABLES[device] = codes.view(FP8_DTYPE).float()
    return _TABLES[device]


def fp8_linear_table(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     input_scale: torch.Tensor | None, spec: Fp8LinearSpec,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    values = torch.take(_values_of_bytes(weight.device), weight.view(torch.uint8).long())
    scale = weight_scale if spec.block is None else expand_block_scales(weight_scale, spec.block, weight.shape)
    return _quantized_linear(x, (values * scale).to(x.dtype), input_scale, spec, bias)
