"""The radix tree index and the eviction policies, through the block manager: leaves evicted first, partial blocks
matched to the token (once their writing step reported), subtrees dropped with their root, and lru / lfu / cost orders."""

from __future__ import annotations

import pytest

from rapid_llm.scheduler_proc.block_manager import BlockManager, make_index
from rapid_llm.scheduler_proc.eviction_policy import EvictionQueue, recompute_cost
from rapid_llm.utils.block_hash import hash_block

BS = 4


def chain(tokens: list[int]) -> list[bytes]:
    hashes: list[bytes] = []
    for start in range(0, len(tokens) - len(tokens) % BS, BS):
        hashes.append(hash_block(hashes[-1] if hashes else None, tokens[start:start + BS], None))
    return hashes


def pool_of(num_blocks: int, policy: str = "radix", eviction: str = "lru") -> BlockManager:
    return BlockManager(num_blocks, BS, make_index(policy, num_blocks, eviction))


def cache_sequence(pool: BlockManager, tokens: list[int], hold: bool = False) -> list[int]:
    """Allocate blocks for `tokens`, cache the full ones (and the partial tail), and free them unless `hold`."""
    hashes = chain(tokens)
    blocks = pool.allocate(-(-len(tokens) // BS))
    for index, block_hash in enumerate(hashes):
        pool.cache_block(blocks[index], block_hash, hashes[index - 1] if index else None,
                         tokens[index * BS:(index + 1) * BS], index * BS)
    if len(tokens) % BS:
        tail = len(hashes) * BS
        pool.cache_partial(blocks[-1], hashes[-1] if hashes else None, tokens[tail:], tail)
    if not hold:
        pool.free(reversed(blocks))
    return blocks


def test_a_prefix_is_evicted_from_its_tail_even_when_its_head_was_freed_last() -> None:
    pool = pool_of(4)
    tokens = list(range(1, 13))  # three full blocks
    blocks = cache_sequence(pool, tokens, hold=True)
    pool.free(blocks)  # head first: under the hash index's LRU the head would go first and strand the rest
    assert pool.num_free_blocks == 4
    evicted = [pool.allocate(1)[0] for _ in range(4)]
    assert evicted == [3, blocks[2], blocks[1], blocks[0]]  # the spare block, then the tail upwards
    assert pool.lookup(chain(tokens)) == []


def test_the_hash_index_strands_a_tail_where_the_tree_does_not() -> None:
    pool = pool_of(3, policy="hash")
    tokens = list(range(1, 13))
    blocks = cache_sequence(pool, tokens, hold=True)
    pool.free(blocks)
    assert pool.allocate(1) == [blocks[0]]
    assert pool.lookup(chain(tokens)) == [] and pool.cached_block(chain(tokens)[2]) == blocks[2]


def test_a_partial_hit_finds_the_longest_shared_run_inside_a_block() -> None:
    pool = pool_of(8)
    blocks = cache_sequence(pool, [1, 2, 3, 4, 5, 6, 7])  # one full block, then 3 tokens
    other = cache_sequence(pool, [1, 2, 3, 4, 5, 9, 9, 9])  # leaves the first at its 6th token
    head = chain([1, 2, 3, 4])[0]
    assert pool.match_partial(head, [5, 6, 7, 8]) is None, "nothing is a source before its writing step reports"
    pool.index.settle(0)
    assert pool.match_partial(head, [5, 6, 7, 8]) == (blocks[1], 3)
    assert pool.match_partial(head, [5, 9, 9, 1]) == (other[1], 3)
    assert pool.match_partial(head, [5, 2]) in {(blocks[1], 1), (other[1], 1)}
    assert pool.match_partial(head, [6]) is None
    assert pool.match_partial(None, [1, 2, 7]) == (blocks[0], 2), "a full block is a source too"


def test_a_partial_block_a_sibling_already_holds_is_not_kept() -> None:
    pool = pool_of(8)
    cache_sequence(pool, [1, 2, 3, 4, 5, 6, 7, 8])
    kept = cache_sequence(pool, [1, 2, 3, 4, 5, 6])[1]
    assert not pool.index.holds(kept)
    assert pool.num_free_blocks == 8


def test_uncaching_a_block_drops_its_subtree_and_keeps_blocks_in_use_uncached() -> None:
    pool = pool_of(8)
    tokens = list(range(1, 14))
    blocks = cache_sequence(pool, tokens, hold=True)
    pool.free(blocks[:2])
    pool.uncache([blocks[1]])
    assert [pool.index.holds(block) for block in blocks] == [True, False, False, False]
    assert pool.num_free_blocks == 8 - 2 and pool.num_used_blocks == 2
    pool.free(blocks[2:])
    assert pool.num_free_blocks == 8 and pool.lookup(chain(tokens)) == [blocks[0]]


def test_an_unreferenced_block_above_one_in_use_is_evicted_with_its_subtree() -> None:
    pool = pool_of(4)
    tokens = list(range(1, 9))
    hashes = chain(tokens)
    original = cache_sequence(pool, tokens[:4])[0]
    copy, second = pool.allocate(2)  # a request computed block 0 again (it missed), then block 1 under it
    pool.cache_block(copy, hashes[0], None, tokens[:4], 0)
    pool.cache_block(second, hashes[1], hashes[0], tokens[4:], 4)
    assert not pool.index.holds(copy) and pool.lookup(hashes) == [original, second]
    assert pool.num_free_blocks == 2  # the spare one and `original`, though no leaf is evictable
    assert sorted(pool.allocate(2)) == sorted([3, original])
    assert not pool.index.holds(second) and pool.ref_count(second) == 1


def test_reset_forgets_every_node() -> None:
    pool = pool_of(4)
    cache_sequence(pool, list(range(1, 11)))
    pool.reset_cache()
    assert pool.num_free_blocks == 4 and pool.lookup(chain(list(range(1, 11)))) == []


@pytest.mark.parametrize(("eviction", "order"), [("lru", ["hot", "deep", "shallow"]),
                                                ("lfu", ["deep", "shallow", "deep"]),
                                                ("cost", ["shallow", "deep", "deep"])])
def test_eviction_policies_order_the_victims(eviction: str, order: list[str]) -> None:
    pool = pool_of(6, eviction=eviction)
    hot = cache_sequence(pool, [10, 11, 12, 13])[0]
    for _ in range(3):  # three admissions hit it, the last well before the others are cached
        pool.share([hot])
        pool.count_hits([hot])
        pool.free([hot])
    # Three blocks, evictable from the leaf up; the leaf costs the most to recompute.
    deep = cache_sequence(pool, list(range(30, 42)))
    shallow = cache_sequence(pool, [20, 21, 22, 23])[0]
    names = {hot: "hot", shallow: "shallow"} | dict.fromkeys(deep, "deep")
    assert pool.allocate(1) == [5], "the block that caches nothing goes first"
    assert [names[pool.allocate(1)[0]] for _ in range(3)] == order


def test_the_queue_is_lazy_but_bounded() -> None:
    queue = EvictionQueue(8, "lru")
    for _ in range(100):
        for block in range(8):
            queue.push(block)
            queue.remove(block)
    assert len(queue) == 0 and len(queue._heap) <= 64 + 2
    for block in (3, 1, 2):
        queue.push(block)
    assert [queue.pop() for _ in range(3)] == [3, 1, 2]
    with pytest.raises(ValueError, match="no evictable block"):
        queue.pop()


def test_recompute_cost_grows_with_the_position() -> None:
    assert recompute_cost(0, 16) < recompute_cost(4096, 16)
    assert recompute_cost(0, 16) == 16 + 136 / 16384


def test_a_partial_hit_stays_within_its_namespace() -> None:
    pool = pool_of(4)
    block = pool.allocate(1)[0]
    pool.cache_partial(block, None, [1, 2, 3], 0, namespace="lora:1")
    pool.free([block])
    pool.index.settle(0)
    assert pool.match_partial(None, [1, 2, 3]) is None, "a base-model prompt must not read an adapter's KV"
    assert pool.match_partial(None, [1, 2, 3], namespace="lora:2") is None
    assert pool.match_partial(None, [1, 2, 3], namespace="lora:1") == (block, 3)
