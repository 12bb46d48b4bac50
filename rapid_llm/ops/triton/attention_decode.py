"""Decode attention in Triton with split-KV (flash-decoding): one query token per sequence.

A decode has too little work per sequence to fill a GPU, so its keys are cut into splits of
`split_len` positions. Stage 1, one program per (sequence, KV head, split), attends all query heads
of the KV head (GQA: K/V are read once per group) over its split and writes a normalised partial
output and its log2-sum-exp; empty splits (past a short sequence's end, or before its sliding
window) write lse = -inf. Stage 2, one program per (sequence, query head), merges the splits.
Usage: `decode_attention(query, kv_cache, output, seq_ids, ...)`, called by the Triton backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.triton.attention_common import LOG2_E, attend_keys, dot_operands

@triton.jit
def _split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, partial_ptr, lse_ptr, seq_ids_ptr, query_start_ptr, seq_lens_ptr,
                  block_tables_ptr, q_token_stride, q_head_stride, block_table_stride, slot_stride, cache_head_stride,
                  scale_log2, window, block_size, head_dim, split_len, num_heads, GROUP: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr,
                  PRECISION: tl.constexpr):
    decode = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq = tl.load(seq_ids_ptr + decode)
    token = tl.load(query_start_ptr + seq)
    seq_len = tl.load(seq_lens_ptr + seq)

    group_rows = tl.arange(0, BLOCK_H)  # padded to 16: tl.dot's smallest tile
    head_mask = group_rows < GROUP
    heads = kv_head * GROUP + group_rows
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    q_offsets = token * q_token_stride + heads[:, None] * q_head_stride + dims[None, :]
    query = tl.load(q_ptr + q_offsets, mask=head_mask[:, None] & dim_mask[None, :], other=0.0).to(DOT_DTYPE)

    query_pos = tl.zeros([BLOCK_H], tl.int64) + seq_len - 1  # every head of the group attends from one token
    key_begin = tl.maximum(split * split_len, tl.maximum(seq_len - window, 0))
    key_end = tl.minimum((split + 1) * split_len, seq_len)
    block_table_row = block_tables_ptr + seq * block_table_stride
    row_max, row_sum, acc = attend_keys(
        query, query_pos, key_begin, key_end, window, k_cache_ptr, v_cache_ptr, block_table_row, kv_head, dims,
        dim_mask, block_size, slot_stride, cache_head_stride, scale_log2, BLOCK_H, BLOCK_N, BLOCK_D, DOT_DTYPE,
        PRECISION)

    has_keys = row_sum > 0
    safe_sum = tl.where(has_keys, row_sum, 1.0)
    lse = tl.where(has_keys, row_max + tl.log2(safe_sum), float("-inf"))
    split_rows = (decode * num_heads + heads) * num_splits + split
    tl.store(lse_ptr + split_rows, lse, mask=head_mask)
    tl.store(partial_ptr + split_rows[:, None] * head_dim + dims[None, :], acc / safe_sum[:, None],
             mask=head_mask[:, None] & dim_mask[None, :])


@triton.jit
def _merge_kernel(partial_ptr, lse_ptr, out_ptr, seq_ids_ptr, query_start_ptr, out_token_stride, out_head_stride,
                  head_dim, num_splits, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    decode = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(query_start_ptr + tl.load(seq_ids_ptr + decode))
    splits = tl.arange(0, BLOCK_S)
    split_mask = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    split_rows = (decode * tl.num_programs(1) + head) * num_splits + splits
    lse = tl.load(lse_ptr + split_rows, mask=split_mask, other=float("-inf"))
    # The split holding the last key is never empty, so the max is finite.
    weights = tl.exp2(lse - tl.max(lse, 0))
    partial = tl.load(partial_ptr + split_rows[:, None] * head_dim + dims[None, :],
                      mask=split_mask[:, None] & dim_mask[None, :], other=0.0)
    out = tl.sum(weights[:, None] * partial, 0) / tl.sum(weights, 0)
    tl.store(out_ptr + token * out_token_stride + head * out_head_stride + dims, out.to(out_ptr.dtype.element_ty),
             mask=dim_mask)


def decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor, seq_ids: torch.Tensor,
                     query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                     num_splits: int, split_len: int, scale: float, window: int) -> None:
    """Attention of the one-token sequences `seq_ids` into their rows of `output`."""
    num_decodes = seq_ids.shape[0]
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    dot_dtype, precision = dot_operands(kv_cache)
    block_n = 64 if kv_cache.element_size() < 4 else 32  # fp32 tiles halved: 43 KB of shared memory at D=128
    partial = torch.empty(num_decodes, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    lse = torch.empty(num_decodes, num_heads, num_splits, dtype=torch.float32, device=query.device)
    _split_kernel[(num_decodes, num_kv_heads, num_splits)](
        query, kv_cache[0], kv_cache[1], partial, lse, seq_ids, query_start_loc, seq_lens, block_tables,
        query.stride(0), query.stride(1), block_tables.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        scale * LOG2_E, window, block_size, head_dim, split_len, num_heads, GROUP=group,
        BLOCK_H=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d, DOT_DTYPE=dot_dtype,
        PRECISION=precision, num_warps=4, num_stages=2)
    _merge_kernel[(num_decodes, num_heads)](
        partial, lse, output, seq_ids, query_start_loc, output.stride(0), output.stride(1), head_dim, num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d, num_warps=1)
