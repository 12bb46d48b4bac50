"""Shared by the attention backend tests: naive attention and a mixed batch run through a backend.

`run_mixed_batch` fills each sequence's cached context with one prefill step through the backend under
test, then runs one step of new tokens (decodes, fresh prefills, chunks after context) and returns the
backend's output beside naive float64 attention over the full history.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rapid_llm.ops.attention import AttentionBackend, StepLayout


def naive_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context_len: int, scale: float,
                    window: int | None) -> torch.Tensor:
    """query [q, H, D] for positions context_len.., keys/values [context_len + q, Hkv, D]."""
    group = query.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", query.double(), keys.double()) * scale
    q_pos = torch.arange(query.shape[0])[:, None] + context_len
    k_pos = torch.arange(keys.shape[0])[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= q_pos - k_pos < window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.double()).float()


def run_mixed_batch(backend: AttentionBackend, shapes: Sequence[tuple[int, int]], *, heads: int = 4,
                    kv_heads: int = 2, head_dim: int = 8, block_size: int = 3, dtype: torch.dtype = torch.float32,
                    window: int | None = None, scale: float = 0.3, unwritten: float = 0.0,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """shapes: per sequence (context already cached, new tokens); cache slots no step writes hold `unwritten`.
    Returns (output, naive) [T, H, D]."""
    num_blocks = sum(-(-(c + n) // block_size) for c, n in shapes) + 3
    kv_cache = torch.full((2, num_blocks, block_size, kv_heads, head_dim), unwritten, dtype=dtype)
    free = torch.randperm(num_blocks).tolist()
    tables = [[free.pop() for _ in range(-(-(c + n) // block_size))] for c, n in shapes]
    full_k = [torch.randn(c + n, kv_heads, head_dim).to(dtype) for c, n in shapes]
    full_v = [torch.randn(c + n, kv_heads, head_dim).to(dtype) for c, n in shapes]
    cpu = torch.device("cpu")
    cached = [i for i, (c, _) in enumerate(shapes) if c]
    if cached:
        prefill = StepLayout([shapes[i][0] for i in cached], [shapes[i][0] for i in cached],
                             [tables[i] for i in cached], block_size)
        ctx_k = torch.cat([full_k[i][: shapes[i][0]] for i in cached])
        ctx_v = torch.cat([full_v[i][: shapes[i][0]] for i in cached])
        backend.forward(torch.randn(len(ctx_k), heads, head_dim).to(dtype), ctx_k, ctx_v, kv_cache,
                        backend.build_metadata(prefill, cpu), scale, window)
    layout = StepLayout([n for _, n in shapes], [c + n for c, n in shapes], tables, block_size)
    query = torch.randn(layout.num_tokens, heads, head_dim).to(dtype)
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, shapes)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, shapes)])
    output = backend.forward(query, new_k, new_v, kv_cache, backend.build_metadata(layout, cpu), scale, window)
    expected, start = [], 0
    for (context, new), keys, values in zip(shapes, full_k, full_v):
        expected.append(naive_attention(query[start : start + new], keys, values, context, scale, window))
        start += new
    return output, torch.cat(expected)
