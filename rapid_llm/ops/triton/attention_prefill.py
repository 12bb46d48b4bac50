"""Prefill / extend attention in Triton: flash attention of a chunk of queries over the paged cache.

One program per (sequence, block of BLOCK_M queries, query head). Its queries sit after `context`
cached tokens; it walks the keys it may see -- from the sliding-window start of its first query to
the causal end of its last -- in BLOCK_N steps, reading K/V through the block table (the step's own
K/V are already in the cache), with an online softmax in fp32.
Usage: `prefill_attention(query, kv_cache, output, seq_ids, ...)`, called by the Triton backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.triton.attention_common import LOG2_E, attend_keys, dot_operands


@triton.jit
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, seq_ids_ptr, query_start_ptr, seq_lens_ptr,
                    block_tables_ptr, q_token_stride, q_head_stride, out_token_stride, out_head_stride,
                    block_table_stride, slot_stride, cache_head_stride, scale_log2, window, block_size, head_dim,
                    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    seq = tl.load(seq_ids_ptr + tl.program_id(0))
    query_start = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - query_start
    first_row = tl.program_id(1) * BLOCK_M
    if first_row >= query_len:  # the grid covers the longest chunk of the step
        return
    head = tl.program_id(2)
    kv_head = head // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - query_len

    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < query_len
    query_pos = context + rows
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    q_offsets = (query_start + rows)[:, None] * q_token_stride + head * q_head_stride + dims[None, :]
    query = tl.load(q_ptr + q_offsets, mask=row_mask[:, None] & dim_mask[None, :], other=0.0).to(DOT_DTYPE)

    block_table_row = block_tables_ptr + seq * block_table_stride
    key_end = tl.minimum(seq_len, context + first_row + BLOCK_M)
    key_begin = tl.maximum(context + first_row - window + 1, 0) // BLOCK_N * BLOCK_N
    _, row_sum, acc = attend_keys(
        query, query_pos, key_begin, key_end, window, k_cache_ptr, v_cache_ptr, block_table_row, kv_head, dims,
        dim_mask, block_size, slot_stride, cache_head_stride, scale_log2, BLOCK_M, BLOCK_N, BLOCK_D, DOT_DTYPE,
        PRECISION)

    # Every real row sees at least its own key; padding rows (never stored) divide by 1, not 0.
    out = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
    out_offsets = (query_start + rows)[:, None] * out_token_stride + head * out_head_stride + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


def prefill_attention(query: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor, seq_ids: torch.Tensor,
                      query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                      max_query_len: int, scale: float, window: int) -> None:
    """Attention of the sequences `seq_ids` (chunks of several queries) into their rows of `output`."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    block_d = max(16, triton.next_power_of_2(head_dim))
    # Tiles sized to fit ~100 KB of shared memory (consumer sm_8x) at two pipeline stages: measured 16-49 KB
    # for half dtypes up to head_dim 256, 53 KB for fp32 at head_dim 128 (fp32 at 256: 100 KB).
    half = kv_cache.element_size() < 4
    block_m = 64 if half else 32
    block_n = 64 if half and block_d <= 128 else 32
    dot_dtype, precision = dot_operands(kv_cache)
    grid = (seq_ids.shape[0], triton.cdiv(max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        query, kv_cache[0], kv_cache[1], output, seq_ids, query_start_loc, seq_lens, block_tables, query.stride(0),
        query.stride(1), output.stride(0), output.stride(1), block_tables.stride(0), kv_cache.stride(2),
        kv_cache.stride(3), scale * LOG2_E, window, block_size, head_dim, GROUP=num_heads // num_kv_heads,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DOT_DTYPE=dot_dtype, PRECISION=precision,
        num_warps=4 if block_d <= 64 else 8, num_stages=2)
