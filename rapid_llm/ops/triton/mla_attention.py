"""Weight-absorbed MLA attention in Triton: every query head attends over the paged latents themselves.

With kv_b_proj folded into the query (ops/attention/mla_triton.py), MLA is multi-query attention with one
KV head: score = q_latent . latent[:kv_lora_rank] + q_rope . latent[kv_lora_rank:], value =
latent[:kv_lora_rank]. A sequence's (token, head) pairs are flattened into rows token * H + head, and one
program per (BLOCK_M rows, sequence) walks the keys its rows may see (causal) in BLOCK_N steps with an
online softmax in fp32: a decode's heads share each latent load, and prefills, chunks after cached context
and decodes of one step go in one launch. Output is in latent space ([T, H, kv_lora_rank]). No split-KV:
a long decode runs in cdiv(H, BLOCK_M) programs.
Usage: `mla_attention(q_latent, q_rope, kv_cache, output, seq_ids, ...)`, called by the Triton MLA backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.triton.attention_common import LOG2_E, NEG_LARGE, dot_operands, load_paged


@triton.jit
def _mla_kernel(q_latent_ptr, q_rope_ptr, cache_ptr, out_ptr, seq_ids_ptr, query_start_ptr, seq_lens_ptr,
                block_tables_ptr, q_latent_token_stride, q_latent_head_stride, q_rope_token_stride,
                q_rope_head_stride, out_token_stride, out_head_stride, block_table_stride, slot_stride, scale_log2,
                block_size, num_heads, kv_lora_rank, rope_dim, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    seq = tl.load(seq_ids_ptr + tl.program_id(1))
    query_start = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - query_start
    first_row = tl.program_id(0) * BLOCK_M
    if first_row >= query_len * num_heads:  # the grid covers the longest chunk of the step
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - query_len

    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < query_len * num_heads
    tokens = query_start + rows // num_heads
    heads = rows % num_heads
    query_pos = context + rows // num_heads
    latent_dims = tl.arange(0, BLOCK_C)
    latent_mask = latent_dims < kv_lora_rank
    rope_dims = tl.arange(0, BLOCK_R)
    rope_mask = rope_dims < rope_dim
    q_latent = tl.load(q_latent_ptr + tokens[:, None] * q_latent_token_stride + heads[:, None] * q_latent_head_stride
                       + latent_dims[None, :], mask=row_mask[:, None] & latent_mask[None, :], other=0.0)
    q_rope = tl.load(q_rope_ptr + tokens[:, None] * q_rope_token_stride + heads[:, None] * q_rope_head_stride
                     + rope_dims[None, :], mask=row_mask[:, None] & rope_mask[None, :], other=0.0)
    q_latent = q_latent.to(DOT_DTYPE)
    q_rope = q_rope.to(DOT_DTYPE)

    block_table_row = block_tables_ptr + seq * block_table_stride
    last_pos = context + (first_row + BLOCK_M - 1) // num_heads  # the tile's last row, possibly padding
    key_end = tl.minimum(seq_len, last_pos + 1)
    row_max = tl.full([BLOCK_M], NEG_LARGE, tl.float32)
    row_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
    for block_start in range(0, key_end, BLOCK_N):
        key_pos = block_start + tl.arange(0, BLOCK_N)
        key_mask = key_pos < key_end
        # One KV "head" (the latent), so head index and stride are 0; the rope key follows the compressed part.
        latent = load_paged(cache_ptr, block_table_row, key_pos, key_mask, 0, latent_dims, latent_mask, block_size,
                            slot_stride, 0).to(DOT_DTYPE)
        rope = load_paged(cache_ptr + kv_lora_rank, block_table_row, key_pos, key_mask, 0, rope_dims, rope_mask,
                          block_size, slot_stride, 0).to(DOT_DTYPE)
        scores = tl.dot(q_latent, tl.trans(latent), input_precision=PRECISION)
        scores = (scores + tl.dot(q_rope, tl.trans(rope), input_precision=PRECISION)) * scale_log2
        visible = key_mask[None, :] & (key_pos[None, :] <= query_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        correction = tl.exp2(row_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.sum(probs, 1)
        acc = acc * correction[:, None] + tl.dot(probs.to(DOT_DTYPE), latent, input_precision=PRECISION)
        row_max = new_max

    # Every real row sees at least its own key; padding rows (never stored) divide by 1, not 0.
    out = acc / tl.where(row_sum > 0, row_sum, 1.0)[:, None]
    out_offsets = tokens[:, None] * out_token_stride + heads[:, None] * out_head_stride + latent_dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & latent_mask[None, :])


def tile_sizes(element_size: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for a cache of `element_size` bytes: fp32 tiles halved, so a 512-wide latent tile and
    its pipeline copy fit ~100 KB of shared memory (consumer sm_8x)."""
    return (32, 32) if element_size < 4 else (16, 16)


def mla_attention(q_latent: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor,
                  seq_ids: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  block_tables: torch.Tensor, max_query_len: int, scale: float) -> None:
    """Latent-space attention of the sequences `seq_ids` into their rows of `output` [T, H, kv_lora_rank].

    q_latent [T, H, kv_lora_rank] (the absorbed nope query), q_rope [T, H, qk_rope] (may be a strided view),
    kv_cache [blocks, block_size, kv_lora_rank + qk_rope] contiguous.
    """
    if any(tensor.stride(-1) != 1 for tensor in (q_latent, q_rope, output)) or not kv_cache.is_contiguous():
        raise ValueError("triton mla_attention: queries and output need a contiguous last dimension, the cache "
                         "contiguous")
    num_heads, kv_lora_rank = q_latent.shape[1], q_latent.shape[2]
    rope_dim = kv_cache.shape[2] - kv_lora_rank
    block_m, block_n = tile_sizes(kv_cache.element_size())
    block_c = max(16, triton.next_power_of_2(kv_lora_rank))
    dot_dtype, precision = dot_operands(kv_cache)
    # Row tiles on grid axis 0 (up to 2^31 - 1; axis 1 stops at 65535): a 32k-token chunk of 128 heads is 131072.
    grid = (triton.cdiv(max_query_len * num_heads, block_m), seq_ids.shape[0])
    _mla_kernel[grid](
        q_latent, q_rope, kv_cache, output, seq_ids, query_start_loc, seq_lens, block_tables, q_latent.stride(0),
        q_latent.stride(1), q_rope.stride(0), q_rope.stride(1), output.stride(0), output.stride(1),
        block_tables.stride(0), kv_cache.stride(1), scale * LOG2_E, kv_cache.shape[1], num_heads, kv_lora_rank,
        rope_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_C=block_c, BLOCK_R=max(16, triton.next_power_of_2(rope_dim)),
        DOT_DTYPE=dot_dtype, PRECISION=precision, num_warps=4 if block_c <= 128 else 8, num_stages=2)
