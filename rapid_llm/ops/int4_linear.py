"""The `int4_linear` op: y = x @ ((q - zero) * scale)ᵀ + b over int4 weights in groups of input channels (W4A16),
with optionally each token's input quantized to int8 and back first (W4A8).

Its implementations are Int4Kernels that own a weight format: `prepare` takes the canonical int4 form
(rapid_llm/quantization/int4_math.py: q [out, in] 0..15, fp32 scales and zeros [out, groups]) once per layer and
returns (weight, params) in its own layout; `__call__(x, weight, params, spec, bias)` applies it.
torch_ref keeps two nibbles per byte and dequantizes the whole weight on every call (the oracle).
cpu_int4pack runs torch's own CPU int4 GEMM (`_weight_int4pack_mm_for_cpu`, w = (q - 8) * s + z per group of
32/64/128/256): the zero becomes z = (8 - zero) * scale, rounded to the activation dtype. W4A8 on either is
int8 fake quantization of x then the same GEMM (the numerics of an int8 kernel up to summation order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rapid_llm.quantization.int4_math import SYMMETRIC_ZERO, dequantize, fake_quantize_int8_per_token

_INT4PACK_GROUPS = (256, 128, 64, 32)


@dataclass(frozen=True)
class Int4LinearSpec:
    group_size: int  # contiguous input channels per scale (in_features: one group per row)
    int8_activations: bool  # W4A8: x quantized per token to int8 and back before the GEMM


class Int4Kernel:
    def skip_reason(self, out_features: int, in_features: int, group_size: int) -> str | None:
        """Why this implementation cannot hold a layer of these shapes (None: it can)."""
        return None

    def prepare(self, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, params: torch.Tensor, spec: Int4LinearSpec,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class TorchInt4(Int4Kernel):
    """weight: uint8 [out, in / 2] (even input channel in the low nibble); params: fp32 [out, groups, 2]
    (scale, zero)."""

    def skip_reason(self, out_features: int, in_features: int, group_size: int) -> str | None:
        return None if in_features % 2 == 0 else f"{in_features} input features are not a whole number of bytes"

    def prepare(self, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = q.to(torch.uint8).unflatten(1, (-1, 2))
        return pairs[..., 0] | (pairs[..., 1] << 4), torch.stack([scales.float(), zeros.float()], dim=-1)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, params: torch.Tensor, spec: Int4LinearSpec,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        q = torch.stack([weight & 0xF, weight >> 4], dim=-1).flatten(1)
        w = dequantize(q, params[..., 0], params[..., 1], spec.group_size, x.dtype)
        if spec.int8_activations:
            x = fake_quantize_int8_per_token(x)
        return F.linear(x, w, bias)


def _int4pack_group(group_size: int) -> int | None:
    """The largest group the torch kernel takes that splits `group_size` evenly (scales repeat into it)."""
    return next((size for size in _INT4PACK_GROUPS if group_size % size == 0), None)


class CpuInt4Pack(Int4Kernel):
    """weight: torch's packed int4 [out, in / 2]; params: [in / g, out, 2] (scale, z) in the activation dtype."""

    def skip_reason(self, out_features: int, in_features: int, group_size: int) -> str | None:
        if _int4pack_group(group_size) is None:
            return f"group size {group_size} is not a multiple of 32"
        return None

    def prepare(self, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        kernel_group = _int4pack_group(group_size)
        repeat = group_size // kernel_group
        scales = scales.float().repeat_interleave(repeat, dim=1)
        shifted = ((SYMMETRIC_ZERO - zeros.float()).repeat_interleave(repeat, dim=1)) * scales
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        return weight, torch.stack([scales, shifted], dim=-1).transpose(0, 1).contiguous().to(dtype)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, params: torch.Tensor, spec: Int4LinearSpec,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        if spec.int8_activations:
            x = fake_quantize_int8_per_token(x)
        kernel_group = x.shape[-1] // params.shape[0]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]).contiguous(), weight,
                                                       kernel_group, params)
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return y + bias if bias is not None else y


def int4pack_missing(device_type: str, dtype: str) -> str | None:
    """Skip reason when this torch build lacks the CPU int4 GEMM."""
    if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
        return f"torch {torch.__version__} has no aten._weight_int4pack_mm_for_cpu"
    return None


TORCH_INT4 = TorchInt4()
CPU_INT4PACK = CpuInt4Pack()
