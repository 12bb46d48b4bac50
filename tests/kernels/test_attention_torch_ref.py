"""The torch reference attention backend matches naive per-sequence causal attention."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.registry import REGISTRY


def _naive(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context_len: int, scale: float,
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


@pytest.mark.parametrize("window", [None, 5])
def test_mixed_batch_matches_naive_attention(window: int | None) -> None:
    torch.manual_seed(0)
    block_size, heads, kv_heads, head_dim, num_blocks = 3, 4, 2, 8, 40
    backend = REGISTRY.select("attention", "cpu", "float32").fn
    kv_cache = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim)
    # (context already cached, new tokens): a decode, a fresh prefill, a chunk after cached tokens.
    shapes = [(9, 1), (0, 7), (5, 4), (12, 1)]
    free = list(torch.randperm(num_blocks).tolist())
    tables = [[free.pop() for _ in range(-(-(c + n) // block_size))] for c, n in shapes]
    full_k = [torch.randn(c + n, kv_heads, head_dim) for c, n in shapes]
    full_v = [torch.randn(c + n, kv_heads, head_dim) for c, n in shapes]
    # Fill the cached context through the backend itself, one prefill step.
    prefill = StepLayout([c for c, _ in shapes if c], [c for c, _ in shapes if c],
                         [t for t, (c, _) in zip(tables, shapes) if c], block_size)
    ctx_k = torch.cat([k[:c] for k, (c, _) in zip(full_k, shapes) if c])
    ctx_v = torch.cat([v[:c] for v, (c, _) in zip(full_v, shapes) if c])
    backend.forward(torch.randn(len(ctx_k), heads, head_dim), ctx_k, ctx_v, kv_cache,
                    backend.build_metadata(prefill, torch.device("cpu")), 0.3, window)

    layout = StepLayout([n for _, n in shapes], [c + n for c, n in shapes], tables, block_size)
    query = torch.randn(layout.num_tokens, heads, head_dim)
    new_k = torch.cat([k[c:] for k, (c, _) in zip(full_k, shapes)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(full_v, shapes)])
    output = backend.forward(query, new_k, new_v, kv_cache, backend.build_metadata(layout, torch.device("cpu")),
                             0.3, window)
    start = 0
    for (context, new), keys, values in zip(shapes, full_k, full_v):
        expected = _naive(query[start : start + new], keys, values, context, 0.3, window)
        torch.testing.assert_close(output[start : start + new], expected, atol=1e-5, rtol=1e-5)
        start += new


def test_metadata_positions_and_slots() -> None:
    backend = REGISTRY.select("attention", "cpu", "float32").fn
    layout = StepLayout(query_lens=[2, 1], seq_lens=[5, 4], block_tables=[[7, 2], [4, 9]], block_size=3)
    metadata = backend.build_metadata(layout, torch.device("cpu"))
    assert metadata.positions.tolist() == [3, 4, 3]
    # position 3 -> block index 1, offset 0; position 4 -> offset 1
    assert metadata.slot_mapping.tolist() == [2 * 3 + 0, 2 * 3 + 1, 9 * 3 + 0]

