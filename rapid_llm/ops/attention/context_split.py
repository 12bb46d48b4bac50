"""Prefill chunks after cached context on the CPU, split at the context boundary instead of masked.

A chunk's queries see every cached key and their own chunk's keys causally. The padded path hands
`scaled_dot_product_attention` a bool mask, so the CPU flash kernel computes the whole queries x keys
rectangle and converts the mask in every call. Here each sequence is two calls of that kernel
(`_scaled_dot_product_flash_attention_for_cpu`, which also returns the log-sum-exp): its cached keys
without a mask (the query heads of one KV head folded into rows, so GQA repeats only the chunk's keys)
and its new keys with `is_causal`, merged by their log-sum-exp (in bf16 each half is rounded once
more). A 2048-token chunk after 2048 / 6144 cached tokens in llama-10m's shape (8 heads, 4 KV heads,
head dim 32; 1 thread): 1.4-1.7x the masked call in bf16 and fp32; 256 after 1536: 1.03-1.06x.
Sliding windows keep the mask; groups with short chunks only (decodes, speculative verification) keep
the single padded call.
"""

from __future__ import annotations

import torch

# Below this the per-sequence calls cost more than masking one padded call (not tuned finely).
MIN_SPLIT_QUERY_LEN = 64


def splits_at_context(device: torch.device, max_query_len: int, sliding_window: int | None) -> bool:
    return device.type == "cpu" and sliding_window is None and max_query_len >= MIN_SPLIT_QUERY_LEN


def attend_split_at_context(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            lens: list[tuple[int, int]], scale: float) -> torch.Tensor:
    """queries [Bg, H, max_q, D], keys/values [Bg, Hkv, max_kv, D], lens per sequence (cached, new tokens).

    Returns [Bg, H, max_q, D] in the queries' dtype; padding rows are zero.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    heads, kv_heads, head_dim = queries.shape[1], keys.shape[1], queries.shape[3]
    group_size = heads // kv_heads
    output = queries.new_zeros(queries.shape)
    for index, (context, length) in enumerate(lens):
        query = queries[index : index + 1, :, :length]
        new_keys, new_values = (cache[index : index + 1, :, context : context + length].repeat_interleave(
            group_size, 1) for cache in (keys, values))
        recent, recent_lse = flash(query, new_keys, new_values, 0.0, True, scale=scale)[:2]
        if context == 0:
            output[index, :, :length] = recent[0]
            continue
        # Query head h reads KV head h // group_size, so [H, q] rows are [Hkv, group_size * q] rows.
        folded = query.reshape(1, kv_heads, group_size * length, head_dim)
        past, past_lse = flash(folded, keys[index : index + 1, :, :context], values[index : index + 1, :, :context],
                               0.0, False, scale=scale)[:2]
        past, past_lse = past.reshape(1, heads, length, head_dim), past_lse.reshape(1, heads, length)
        total = torch.logaddexp(past_lse, recent_lse)
        merged = past * (past_lse - total).exp().unsqueeze(-1) + recent * (recent_lse - total).exp().unsqueeze(-1)
        output[index, :, :length] = merged[0]
    return output
