"""The `cpu_cpp` implementations of rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding and
kv_cache_store.

Each is one C++ pass (`csrc/fused_elementwise.cpp`, `csrc/kv_cache_store.cpp`) where torch_ref chains 3-9
ATen ops; at decode sizes those ops cost mostly dispatch, so fusing them is what pays. Same signatures and rounding points as the
torch references; inputs are viewed as [rows, width] with contiguous rows (a merged qkv's q/k slices are).
Usage: chosen by priority on a CPU, or `--op-backend rms_norm=cpu_cpp`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.attention.backend import write_kv_cache
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.tensor_rows import rows_of


def _is_rows(x: torch.Tensor) -> bool:
    """Already [rows, width] with unit last stride: the hot path's activations, passed on as they are
    (reshaping and viewing back costs two ATen calls per op, ~5 % of a small model's decode step)."""
    return x.dim() == 2 and x.stride(1) == 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _is_rows(x):
        return CPU_OPS.load().rms_norm(x, weight, eps)
    return CPU_OPS.load().rms_norm(rows_of(x), weight, eps).view(x.shape)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    if _is_rows(x) and _is_rows(residual):
        normed, summed = CPU_OPS.load().fused_add_rms_norm(x, residual, weight, eps)
        return normed, summed
    normed, summed = CPU_OPS.load().fused_add_rms_norm(rows_of(x), rows_of(residual), weight, eps)
    return normed.view(x.shape), summed.view(x.shape)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if _is_rows(x):
        return CPU_OPS.load().silu_and_mul(x)
    return CPU_OPS.load().silu_and_mul(rows_of(x)).view(*x.shape[:-1], x.shape[-1] // 2)


def rotary_embedding(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
                     rotary_dim: int, is_neox_style: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if _is_rows(query) and _is_rows(key):
        return tuple(CPU_OPS.load().rotary_embedding(query, key, cos, sin, head_dim, rotary_dim, is_neox_style))
    rows = query.shape[0]
    rotated_query, rotated_key = CPU_OPS.load().rotary_embedding(
        rows_of(query.reshape(rows, -1)), rows_of(key.reshape(rows, -1)), cos, sin, head_dim, rotary_dim, is_neox_style)
    return rotated_query.view(query.shape), rotated_key.view(key.shape)


def _copies_rows(x: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """[tokens, heads, dim] with each token's heads contiguous, in the cache's dtype: what the C++ copy takes."""
    return x.dtype == kv_cache.dtype and x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def kv_cache_store(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    if not (_copies_rows(key, kv_cache) and _copies_rows(value, kv_cache)):  # the reference casts and gathers
        write_kv_cache(key, value, kv_cache, slot_mapping)
        return
    CPU_OPS.load().kv_cache_store(key, value, kv_cache, slot_mapping)
