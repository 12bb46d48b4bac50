"""Tests for the KV block pool: allocation, reference counts, double free and exhaustion."""

from __future__ import annotations

import pytest

from rapid_llm.scheduler_proc.block_manager import BlockManager


def test_allocate_hands_out_distinct_blocks_and_counts_them() -> None:
    pool = BlockManager(num_blocks=8, block_size=4)
    first, second = pool.allocate(3), pool.allocate(5)
    assert len(set(first + second)) == 8
    assert set(first + second) == set(range(8))
    assert (pool.num_free_blocks, pool.num_used_blocks) == (0, 8)
    assert all(pool.ref_count(block) == 1 for block in first + second)


def test_free_returns_blocks_for_reuse() -> None:
    pool = BlockManager(num_blocks=4, block_size=4)
    blocks = pool.allocate(4)
    pool.free(blocks[:2])
    assert (pool.num_free_blocks, pool.num_used_blocks) == (2, 2)
    assert sorted(pool.allocate(2)) == sorted(blocks[:2])


def test_freed_blocks_are_reused_last() -> None:
    pool = BlockManager(num_blocks=4, block_size=4)
    early = pool.allocate(1)
    pool.free(early)
    assert early[0] not in pool.allocate(3)


def test_shared_block_is_free_only_after_every_reference_is_dropped() -> None:
    pool = BlockManager(num_blocks=2, block_size=4)
    [block] = pool.allocate(1)
    pool.add_ref([block])
    assert pool.ref_count(block) == 2
    pool.free([block])
    assert (pool.ref_count(block), pool.num_free_blocks) == (1, 1)
    pool.free([block])
    assert (pool.ref_count(block), pool.num_free_blocks) == (0, 2)


def test_double_free_raises() -> None:
    pool = BlockManager(num_blocks=2, block_size=4)
    blocks = pool.allocate(1)
    pool.free(blocks)
    with pytest.raises(ValueError, match="freed twice"):
        pool.free(blocks)
    assert pool.num_free_blocks == 2


def test_free_or_share_of_a_never_allocated_block_raises() -> None:
    pool = BlockManager(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="freed twice"):
        pool.free([1])
    with pytest.raises(ValueError, match="cannot be shared"):
        pool.add_ref([0])
    with pytest.raises(ValueError, match="outside"):
        pool.free([2])


def test_exhaustion_raises_and_changes_nothing() -> None:
    pool = BlockManager(num_blocks=3, block_size=4)
    pool.allocate(2)
    assert pool.can_allocate(1) and not pool.can_allocate(2)
    with pytest.raises(ValueError, match="only 1 are free"):
        pool.allocate(2)
    assert pool.num_free_blocks == 1
    assert pool.allocate(0) == []
    with pytest.raises(ValueError, match="negative"):
        pool.allocate(-1)


@pytest.mark.parametrize(("num_tokens", "blocks"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_blocks_for_tokens_rounds_up(num_tokens: int, blocks: int) -> None:
    assert BlockManager(num_blocks=4, block_size=4).blocks_for_tokens(num_tokens) == blocks


def test_rejects_an_empty_pool_or_block() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(num_blocks=0, block_size=4)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(num_blocks=4, block_size=0)
