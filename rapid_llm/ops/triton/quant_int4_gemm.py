"""The `int4_linear` op in Triton: torch_ref's weight format (two nibbles a byte, fp32 (scale, zero) per group) read
by the dequantize-GEMM (quant_gemm.py), W4A8 inputs fake-quantized to int8 per token first (quant_activation.py).

Keeping torch_ref's `prepare` means the two backends hold the same bytes, so either can be pinned per layer and
they differ only in summation order. Usage: registered as int4_linear's "triton" backend (catalog.py).
"""

from __future__ import annotations

import torch

from rapid_llm.ops.int4_linear import Int4LinearSpec, TorchInt4
from rapid_llm.ops.triton.quant_activation import fake_quantize_int8
from rapid_llm.ops.triton.quant_gemm import INT4, dequant_gemm


class TritonInt4(TorchInt4):
    """weight: uint8 [out, in / 2]; params: fp32 [out, groups, 2] (scale, zero), as TorchInt4 prepares them."""

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, params: torch.Tensor, spec: Int4LinearSpec,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        out_features, groups = params.shape[0], params.shape[1]
        if x.shape[-1] != 2 * weight.shape[1] or groups * spec.group_size != x.shape[-1]:
            raise ValueError(f"int4_linear: x has {x.shape[-1]} features; the weight {tuple(weight.shape)} holds "
                             f"{2 * weight.shape[1]}, its params {groups} groups of {spec.group_size}")
        if spec.int8_activations:
            x = fake_quantize_int8(x)
        return dequant_gemm(x, INT4, weight, out_features, params.float().contiguous(), groups, 1, spec.group_size,
                            bias)


TRITON_INT4 = TritonInt4()
