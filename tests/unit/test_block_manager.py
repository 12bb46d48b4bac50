"""Tests for the KV block pool and its prefix cache: allocation, reference counts, double free,
exhaustion, block hashes, hits, LRU eviction and reset."""

from __future__ import annotations

import pytest

from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.utils.block_hash import hash_block


def num_cached_blocks(pool: BlockManager) -> int:
    # Nothing in the engine needs this count, so the pool has no API for it; tests read the hash index's map.
    return len(pool.index._block_of)


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


def test_freed_uncached_blocks_are_reused_first() -> None:
    pool = BlockManager(num_blocks=4, block_size=4)
    early = pool.allocate(1)
    pool.free(early)
    assert pool.allocate(1) == early


def test_shared_block_is_free_only_after_every_reference_is_dropped() -> None:
    pool = BlockManager(num_blocks=2, block_size=4)
    [block] = pool.allocate(1)
    pool.share([block])
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
        pool.share([0])
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


# ---- block hashes ------------------------------------------------------------------------------


def test_block_hash_is_chained_and_keyed() -> None:
    first = hash_block(None, [1, 2, 3, 4], None)
    assert first == hash_block(None, [1, 2, 3, 4], None) and len(first) == 32
    assert first != hash_block(None, [1, 2, 3, 5], None)
    after_first = hash_block(first, [5, 6, 7, 8], None)
    after_other = hash_block(hash_block(None, [9, 2, 3, 4], None), [5, 6, 7, 8], None)
    assert after_first != after_other, "the same tokens after a different prefix hash differently"
    assert after_first != hash_block(None, [5, 6, 7, 8], None)
    assert hash_block(None, [1, 2, 3, 4], "adapter-a") not in (first, hash_block(None, [1, 2, 3, 4], "adapter-b"))
    assert hash_block(None, [1, 2, 3, 4], "") != first


# ---- prefix cache ------------------------------------------------------------------------------


def cached_pool(num_blocks: int, hashes: list[bytes]) -> tuple[BlockManager, list[int]]:
    """A pool where one request held blocks caching `hashes` (in order) and then freed them last first."""
    pool = BlockManager(num_blocks=num_blocks, block_size=4)
    blocks = pool.allocate(len(hashes))
    for block, block_hash in zip(blocks, hashes):
        pool.cache_block(block, block_hash)
    pool.free(reversed(blocks))
    return pool, blocks


def chain(*blocks: list[int]) -> list[bytes]:
    hashes: list[bytes] = []
    for tokens in blocks:
        hashes.append(hash_block(hashes[-1] if hashes else None, tokens, None))
    return hashes


def test_lookup_finds_the_longest_cached_run_from_the_start() -> None:
    a, b, c = chain([1] * 4, [2] * 4, [3] * 4)
    pool, blocks = cached_pool(8, [a, b])
    assert (pool.num_free_blocks, pool.num_used_blocks, num_cached_blocks(pool)) == (8, 0, 2)
    assert pool.lookup([a, b, c]) == blocks
    assert pool.lookup([a]) == blocks[:1]
    assert pool.lookup([c, b]) == [], "the run ends at the first miss"
    assert pool.lookup(chain([9] * 4, [2] * 4)) == []


def test_sharing_a_free_cached_block_takes_it_out_of_the_free_queue() -> None:
    [a] = chain([1] * 4)
    pool, [block] = cached_pool(3, [a])
    assert pool.num_unreferenced([block]) == 1
    pool.share([block])
    pool.share([block])
    assert (pool.ref_count(block), pool.num_free_blocks, pool.num_unreferenced([block])) == (2, 2, 0)
    assert block not in pool.allocate(2)
    pool.free([block])
    pool.free([block])
    assert pool.lookup([a]) == [block] and pool.num_free_blocks == 1


def test_eviction_takes_uncached_blocks_first_then_the_least_recently_freed() -> None:
    pool = BlockManager(num_blocks=6, block_size=4)
    first, second, plain = pool.allocate(2), pool.allocate(2), pool.allocate(2)
    for block, block_hash in zip(first + second, chain([1] * 4, [2] * 4, [3] * 4, [4] * 4)):
        pool.cache_block(block, block_hash)
    pool.free(reversed(first))
    pool.free(reversed(second))
    pool.free(plain)
    assert num_cached_blocks(pool) == 4
    order = [pool.allocate(1)[0] for _ in range(6)]
    assert sorted(order[:2]) == sorted(plain)
    # A request's blocks are freed last first, so the tail of its prefix goes before its head.
    assert order[2:] == [first[1], first[0], second[1], second[0]]
    assert num_cached_blocks(pool) == 0


def test_allocation_evicts_the_hash_so_the_block_is_no_longer_found() -> None:
    a, b = chain([1] * 4, [2] * 4)
    pool, blocks = cached_pool(2, [a, b])
    assert pool.allocate(1) == [blocks[1]]
    assert pool.lookup([a, b]) == [blocks[0]]
    pool.free([blocks[1]])
    with pytest.raises(ValueError, match="caches nothing"):
        pool.share([blocks[1]])


def test_a_second_copy_of_cached_content_stays_uncached() -> None:
    [a] = chain([1] * 4)
    pool = BlockManager(num_blocks=3, block_size=4)
    original, copy = pool.allocate(2)
    pool.cache_block(original, a)
    pool.cache_block(copy, a)
    assert pool.lookup([a]) == [original] and num_cached_blocks(pool) == 1
    pool.free([copy, original])
    assert pool.allocate(1) == [copy], "the uncached copy is reused first"
    assert pool.lookup([a]) == [original]


def test_cache_block_checks_its_block() -> None:
    a, b = chain([1] * 4, [2] * 4)
    pool = BlockManager(num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="only a block in use"):
        pool.cache_block(0, a)
    [block] = pool.allocate(1)
    pool.cache_block(block, a)
    with pytest.raises(ValueError, match="cached already"):
        pool.cache_block(block, b)


def test_reset_cache_forgets_every_block_but_only_when_none_is_used() -> None:
    a, b = chain([1] * 4, [2] * 4)
    pool, blocks = cached_pool(4, [a, b])
    pool.share(blocks[:1])
    with pytest.raises(ValueError, match="1 KV blocks are in use"):
        pool.reset_cache()
    pool.free(blocks[:1])
    pool.reset_cache()
    assert (pool.lookup([a, b]), num_cached_blocks(pool), pool.num_free_blocks) == ([], 0, 4)
