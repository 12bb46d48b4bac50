"""Rotary embedding in Triton: neox or gpt-j (interleaved) pairs, partial rotary, q and k in one launch.

One program per token rotates the pairs of the first `rotary_dim` dims of all its query heads, then
all its key heads (a [heads, pairs] tile each), and copies the rest. Rotation runs in fp32 with one
rounding per output (the torch reference rounds each product in the input dtype, so half outputs
may differ by an ulp).
Usage: `rotary_embedding(q, k, cos, sin, head_dim, rotary_dim, is_neox_style)` on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.triton.launch import warps_for


@triton.jit
def _rotate_heads(src, dst, cos_row, sin_row, num_heads, head_stride, half, rotary_dim, head_dim,
                  IS_NEOX: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_PAIRS: tl.constexpr,
                  BLOCK_REST: tl.constexpr):
    """Rotate the heads of one token: `src` rows are head_stride apart, `dst` rows head_dim apart."""
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    pairs = tl.arange(0, BLOCK_PAIRS)[None, :]
    mask = (heads < num_heads) & (pairs < half)
    if IS_NEOX:
        first, second = pairs, pairs + half
    else:
        first, second = 2 * pairs, 2 * pairs + 1
    src_rows, dst_rows = src + heads * head_stride, dst + heads * head_dim
    x1 = tl.load(src_rows + first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_rows + second, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_row + pairs, mask=pairs < half, other=0.0).to(tl.float32)
    sin = tl.load(sin_row + pairs, mask=pairs < half, other=0.0).to(tl.float32)
    tl.store(dst_rows + first, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=mask)
    tl.store(dst_rows + second, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=mask)
    if BLOCK_REST > 0:  # partial rotary: the dims past rotary_dim pass through
        rest = rotary_dim + tl.arange(0, BLOCK_REST)[None, :]
        rest_mask = (heads < num_heads) & (rest < head_dim)
        tl.store(dst_rows + rest, tl.load(src_rows + rest, mask=rest_mask), mask=rest_mask)


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, q_token_stride, q_head_stride,
                   k_token_stride, k_head_stride, cos_stride, sin_stride, num_q_heads, num_k_heads, half, rotary_dim,
                   head_dim, IS_NEOX: tl.constexpr, BLOCK_Q_HEADS: tl.constexpr, BLOCK_K_HEADS: tl.constexpr,
                   BLOCK_PAIRS: tl.constexpr, BLOCK_REST: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cos_row, sin_row = cos_ptr + token * cos_stride, sin_ptr + token * sin_stride
    _rotate_heads(q_ptr + token * q_token_stride, q_out_ptr + token * num_q_heads * head_dim, cos_row, sin_row,
                  num_q_heads, q_head_stride, half, rotary_dim, head_dim, IS_NEOX, BLOCK_Q_HEADS, BLOCK_PAIRS,
                  BLOCK_REST)
    _rotate_heads(k_ptr + token * k_token_stride, k_out_ptr + token * num_k_heads * head_dim, cos_row, sin_row,
                  num_k_heads, k_head_stride, half, rotary_dim, head_dim, IS_NEOX, BLOCK_K_HEADS, BLOCK_PAIRS,
                  BLOCK_REST)


def _heads(x: torch.Tensor, head_dim: int, name: str) -> torch.Tensor:
    """x [T, H*D] or [T, H, D] as a [T, H, D] view (unit last stride; a copy only if it lacks one)."""
    if x.dim() not in (2, 3) or x.shape[-1] % head_dim or (x.dim() == 3 and x.shape[2] != head_dim):
        raise ValueError(f"rotary_embedding: {name} shape {tuple(x.shape)} does not hold heads of dim {head_dim}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.view(x.shape[0], -1, head_dim)


def rotary_embedding(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H*D] or [T, H, D] and k (KV heads) by cos/sin [T, 1, rotary_dim / 2]."""
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"rotary_embedding: rotary_dim {rotary_dim} must be even and in (0, head_dim={head_dim}]")
    if cos.shape[-1] != rotary_dim // 2 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError(f"rotary_embedding: cos/sin must be [T, 1, {rotary_dim // 2}] with a unit last stride, "
                         f"got {tuple(cos.shape)}")
    q_heads, k_heads = _heads(query, head_dim, "query"), _heads(key, head_dim, "key")
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    num_q_heads, num_k_heads = q_heads.shape[1], k_heads.shape[1]
    rest = head_dim - rotary_dim
    _rotary_kernel[(q_heads.shape[0],)](
        q_heads, k_heads, q_out, k_out, cos, sin, q_heads.stride(0), q_heads.stride(1), k_heads.stride(0),
        k_heads.stride(1), cos.stride(0), sin.stride(0), num_q_heads, num_k_heads, rotary_dim // 2, rotary_dim,
        head_dim, IS_NEOX=is_neox_style, BLOCK_Q_HEADS=triton.next_power_of_2(num_q_heads),
        BLOCK_K_HEADS=triton.next_power_of_2(num_k_heads), BLOCK_PAIRS=triton.next_power_of_2(rotary_dim // 2),
        BLOCK_REST=triton.next_power_of_2(rest) if rest else 0,
        num_warps=warps_for(triton.next_power_of_2(num_q_heads) * triton.next_power_of_2(head_dim)))
    return q_out, k_out
