"""KV-cache specs: per-layer page shapes, bytes per block, and how many tokens a byte budget buys."""

from __future__ import annotations

import torch

from rapid_llm.ops.attention.kv_cache_spec import (
    FullAttentionSpec,
    MLALatentSpec,
    bytes_per_block,
    num_blocks_for_budget,
)

BLOCK_SIZE = 16


def test_page_shapes_and_bytes() -> None:
    dense = FullAttentionSpec(torch.bfloat16, num_kv_heads=8, head_dim=128)
    latent = MLALatentSpec(torch.bfloat16, kv_lora_rank=512, qk_rope_head_dim=64)
    assert dense.page_shape(10, BLOCK_SIZE) == (2, 10, BLOCK_SIZE, 8, 128)
    assert latent.page_shape(10, BLOCK_SIZE) == (10, BLOCK_SIZE, 576)
    assert dense.bytes_per_block(BLOCK_SIZE) == BLOCK_SIZE * 2 * 8 * 128 * 2
    assert latent.bytes_per_block(BLOCK_SIZE) == BLOCK_SIZE * 576 * 2
    assert FullAttentionSpec(torch.float32, 8, 128).bytes_per_block(BLOCK_SIZE) == 2 * dense.bytes_per_block(BLOCK_SIZE)
    assert bytes_per_block([dense, latent], BLOCK_SIZE) == (2 * 8 * 128 + 576) * BLOCK_SIZE * 2


def test_an_mla_cache_of_equal_memory_holds_proportionally_more_tokens() -> None:
    """DeepSeek-V2-Lite's latent (512 + 64) against a dense cache of 16 KV heads x 192."""
    layers, budget = 27, 1 << 30
    dense = [FullAttentionSpec(torch.bfloat16, num_kv_heads=16, head_dim=192)] * layers
    latent = [MLALatentSpec(torch.bfloat16, kv_lora_rank=512, qk_rope_head_dim=64)] * layers
    dense_tokens = num_blocks_for_budget(dense, BLOCK_SIZE, budget) * BLOCK_SIZE
    latent_tokens = num_blocks_for_budget(latent, BLOCK_SIZE, budget) * BLOCK_SIZE
    ratio = (2 * 16 * 192) / 576
    assert abs(latent_tokens / dense_tokens - ratio) < 0.01 * ratio
    # Every block of either cache fits the budget; one more would not.
    assert latent_tokens // BLOCK_SIZE * bytes_per_block(latent, BLOCK_SIZE) <= budget
    assert (latent_tokens // BLOCK_SIZE + 1) * bytes_per_block(latent, BLOCK_SIZE) > budget


def test_zeroing_touches_only_the_given_blocks() -> None:
    for spec in (FullAttentionSpec(torch.float32, 2, 4), MLALatentSpec(torch.float32, 6, 2)):
        cache = spec.allocate(5, 3, torch.device("cpu")).fill_(1.0)
        spec.zero_blocks(cache, torch.tensor([1, 3]))
        blocks = cache.movedim(spec.block_dim, 0).flatten(1)
        assert blocks[[1, 3]].eq(0).all() and blocks[[0, 2, 4]].eq(1).all()
