"""Pieces both Triton attention kernels share: paged K/V loads, the online-softmax walk over keys, dot dtypes.

K/V rows are read straight from the paged cache: each key position finds its block through the
sequence's block-table row, so no history is gathered into a dense copy. Scores are kept in the
log2 domain (scaled by scale * log2(e)) so the softmax uses exp2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rapid_llm.config.dtypes import dtype_name

LOG2_E = 1.0 / math.log(2.0)
# A running max that starts finite: a row whose first key block is all masked (sliding window) then
# gets probabilities exp2(-inf - NEG_LARGE) = 0 instead of the NaN of exp2(-inf - -inf).
NEG_LARGE = tl.constexpr(-1.0e30)  # a constexpr: jit code may read only constexpr globals
NO_WINDOW = 1 << 30  # a window no sequence reaches: the mask arithmetic stays branch-free
_DOT_DTYPES = {"float32": tl.float32, "bfloat16": tl.bfloat16, "float16": tl.float16}


def dot_operands(cache: torch.Tensor) -> tuple[tl.dtype, str]:
    """(dtype tl.dot operands are cast to, input precision) for a cache; accumulation is fp32 either way.

    On GPU the operands keep the cache dtype, and fp32 dots run in full precision ("ieee", not TF32:
    an fp32 model asked for fp32 accuracy); "tf32" is Triton's default, a no-op for half operands.
    CPU tensors run under Triton's interpreter, whose numpy backend keeps bfloat16 as raw uint16 and
    multiplies the bits, so there operands are widened to fp32 (the kernel logic is what it tests).
    """
    dtype = tl.float32 if cache.device.type == "cpu" else _DOT_DTYPES[dtype_name(cache.dtype)]
    return dtype, "ieee" if dtype == tl.float32 else "tf32"


def kernel_window(sliding_window: int | None) -> int:
    """The window the kernels mask with: a layer's sliding window, or NO_WINDOW for full attention."""
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"attention: sliding_window must be at least 1, got {sliding_window}")
    return NO_WINDOW if sliding_window is None else sliding_window


@triton.jit
def load_paged(cache_ptr, block_table_row, key_pos, key_mask, kv_head, dims, dim_mask, block_size, slot_stride,
               head_stride):
    """Rows [len(key_pos), BLOCK_D] of one KV head of `cache_ptr` ([blocks * block_size, Hkv, D] slots)."""
    block = tl.load(block_table_row + key_pos // block_size, mask=key_mask, other=0)
    slot = block * block_size + key_pos % block_size
    offsets = slot[:, None] * slot_stride + kv_head * head_stride + dims[None, :]
    return tl.load(cache_ptr + offsets, mask=key_mask[:, None] & dim_mask[None, :], other=0.0)


@triton.jit
def attend_keys(query, query_pos, key_begin, key_end, window, k_cache_ptr, v_cache_ptr, block_table_row, kv_head,
                dims, dim_mask, block_size, slot_stride, head_stride, scale_log2, BLOCK_ROWS: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """Online softmax of query rows [BLOCK_ROWS, BLOCK_D] at `query_pos` over keys key_begin .. key_end, in
    BLOCK_N steps, each row seeing only keys it may (causal, within `window`).

    Returns each row's running max (log2 domain), sum of exp2 and unnormalised output, all fp32.
    """
    row_max = tl.full([BLOCK_ROWS], NEG_LARGE, tl.float32)
    row_sum = tl.zeros([BLOCK_ROWS], tl.float32)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_D], tl.float32)
    for block_start in range(key_begin, key_end, BLOCK_N):
        key_pos = block_start + tl.arange(0, BLOCK_N)
        key_mask = key_pos < key_end
        keys = load_paged(k_cache_ptr, block_table_row, key_pos, key_mask, kv_head, dims, dim_mask, block_size,
                          slot_stride, head_stride)
        scores = tl.dot(query, tl.trans(keys.to(DOT_DTYPE)), input_precision=PRECISION) * scale_log2
        distance = query_pos[:, None] - key_pos[None, :]
        scores = tl.where(key_mask[None, :] & (distance >= 0) & (distance < window), scores, float("-inf"))
        values = load_paged(v_cache_ptr, block_table_row, key_pos, key_mask, kv_head, dims, dim_mask, block_size,
                            slot_stride, head_stride)
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        correction = tl.exp2(row_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.sum(probs, 1)
        acc = acc * correction[:, None] + tl.dot(probs.to(DOT_DTYPE), values.to(DOT_DTYPE),
                                                 input_precision=PRECISION)
        row_max = new_max
    return row_max, row_sum, acc
