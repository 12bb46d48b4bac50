"""The `cpu_cpp` implementations of rms_norm, fused_add_rms_norm, silu_and_mul and rotary_embedding.

Each is one C++ pass (`csrc/fused_elementwise.cpp`) where torch_ref chains 3-9 ATen ops; at decode sizes
those ops cost mostly dispatch, so fusing them is what pays. Same signatures and rounding points as the
torch references; inputs are viewed as [rows, width] with contiguous rows (a merged qkv's q/k slices are).
Usage: chosen by priority on a CPU, or `--op-backend rms_norm=cpu_cpp`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.tensor_rows import rows_of


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return CPU_OPS.load().rms_norm(rows_of(x), weight, eps).view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    normed, summed = CPU_OPS.load().fused_add_rms_norm(rows_of(x), rows_of(residual), weight, eps)
    return normed.view(x.shape), summed.view(x.shape)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    return CPU_OPS.load().silu_and_mul(rows_of(x)).view(*x.shape[:-1], x.shape[-1] // 2)


def rotary_embedding(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
                     rotary_dim: int, is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows = query.shape[0]
    rotated_query, rotated_key = CPU_OPS.load().rotary_embedding(
        rows_of(query.reshape(rows, -1)), rows_of(key.reshape(rows, -1)), cos, sin, head_dim, rotary_dim, is_neox_style)
    return rotated_query.view(query.shape), rotated_key.view(key.shape)
