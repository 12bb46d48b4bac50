"""Property test of the prefix cache: random interleavings of admit (match, lock, allocate, insert), release
(offer the partial tail, unlock), settle (a step reports), uncache and allocation pressure (evict), against a reference model of what
is cached, for both indexes and every eviction policy.

The reference keeps, for each block the index holds, the token prefix its KV stands for, and the reference counts
of the live requests. After every operation: no referenced block was evicted; every unreferenced block is
counted free; hits are maximal (the longest run of cached full blocks, and with the radix tree the longest settled
partial match after it) and hold what they claim; the tree strands nothing (every cached block's parent prefix is
cached). At the end, with every request released, every reference count is 0.
"""

from __future__ import annotations

import random

import pytest

from rapid_llm.scheduler_proc.block_manager import BlockManager, make_index
from rapid_llm.utils.block_hash import hash_block

BS = 4
NUM_BLOCKS = 24


def chain(tokens: tuple[int, ...]) -> list[bytes]:
    hashes: list[bytes] = []
    for start in range(0, len(tokens) - len(tokens) % BS, BS):
        hashes.append(hash_block(hashes[-1] if hashes else None, tokens[start:start + BS], None))
    return hashes


class Reference:
    """What the cache should hold: block -> the whole token prefix its KV stands for; live references."""

    def __init__(self) -> None:
        self.content: dict[int, tuple[int, ...]] = {}
        self.refs: dict[int, int] = {}
        self.settled: set[int] = set()

    def longest_run(self, tokens: tuple[int, ...], max_blocks: int) -> int:
        cached = set(self.content.values())
        run = 0
        while run < max_blocks and tokens[:(run + 1) * BS] in cached:
            run += 1
        return run

    def longest_partial(self, tokens: tuple[int, ...], run: int, end: int) -> int:
        start, best = run * BS, 0
        for block, prefix in self.content.items():
            if block in self.settled and len(prefix) > start and prefix[:start] == tokens[:start]:
                length = 0
                while start + length < min(len(prefix), end) and prefix[start + length] == tokens[start + length]:
                    length += 1
                best = max(best, length)
        return best


class Harness:
    def __init__(self, policy: str, eviction: str, rng: random.Random) -> None:
        self.pool = BlockManager(NUM_BLOCKS, BS, make_index(policy, NUM_BLOCKS, eviction))
        self.radix = policy == "radix"
        self.ref = Reference()
        self.rng = rng
        self.live: list[tuple[tuple[int, ...], list[int]]] = []
        self.step = 0

    def sync_evictions(self, allocated: list[int]) -> None:
        for block in allocated:
            assert self.ref.refs.get(block, 0) == 0, "a referenced block was handed out again"
            self.ref.refs[block] = 1
        self.forget_dropped()

    def forget_dropped(self) -> None:
        for block in [block for block in self.ref.content if not self.pool.index.holds(block)]:
            del self.ref.content[block]
            self.ref.settled.discard(block)

    def admit(self) -> None:
        # A few shared stems, so that prefixes collide and leave one another inside blocks.
        stem = [(1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 5, 9, 9), (7, 7, 7, 7, 7)][self.rng.randrange(3)]
        tokens = stem[:self.rng.randrange(1, len(stem) + 1)] + tuple(
            self.rng.randrange(1, 4) for _ in range(self.rng.randrange(0, 9)))
        if len(tokens) < 2:
            return
        max_blocks = (len(tokens) - 1) // BS
        hashes = chain(tokens)
        hits = self.pool.lookup(hashes[:max_blocks])
        assert len(hits) == self.ref.longest_run(tokens, max_blocks), "the full-block hit is not maximal"
        for index, block in enumerate(hits):
            assert self.ref.content[block] == tokens[:(index + 1) * BS], "a hit holds other tokens"
        run, start = len(hits), len(hits) * BS
        end = min(start + BS, len(tokens) - 1)
        partial = self.pool.match_partial(hashes[run - 1] if run else None, tokens[start:end]) if end > start else None
        expected = self.ref.longest_partial(tokens, run, end) if self.radix else 0
        assert (partial[1] if partial else 0) == expected, "the partial hit is not maximal"
        if partial:
            assert partial[0] in self.ref.settled, "a block whose writing step has not reported was offered to copy"
        need = -(-len(tokens) // BS) - run + self.pool.num_unreferenced(hits + ([partial[0]] if partial else []))
        if not self.pool.can_allocate(need):
            return
        self.pool.share(hits)
        for block in hits:
            self.ref.refs[block] = self.ref.refs.get(block, 0) + 1
        if partial:
            self.pool.share([partial[0]])
        fresh = self.pool.allocate(-(-len(tokens) // BS) - run)
        self.sync_evictions(fresh)
        if partial:
            self.pool.free([partial[0]])
        blocks = hits + fresh
        for index in range(run, len(hashes)):
            self.pool.cache_block(blocks[index], hashes[index], hashes[index - 1] if index else None,
                                  tokens[index * BS:(index + 1) * BS], index * BS)
            prefix = tokens[:(index + 1) * BS]
            if self.pool.index.holds(blocks[index]):
                assert prefix not in self.ref.content.values(), "content cached twice"
                self.ref.content[blocks[index]] = prefix
            else:
                parent_cached = index == 0 or prefix[:-BS] in self.ref.content.values()
                assert prefix in self.ref.content.values() or (self.radix and not parent_cached), \
                    "a block was refused without its content or (radix) its parent being the reason"
        self.live.append((tokens, blocks))

    def release(self) -> None:
        tokens, blocks = self.live.pop(self.rng.randrange(len(self.live)))
        num_full = len(tokens) // BS
        if len(tokens) % BS:
            before = self.pool.index.holds(blocks[-1])
            self.pool.cache_partial(blocks[-1], chain(tokens)[num_full - 1] if num_full else None,
                                    tokens[num_full * BS:], num_full * BS)
            if self.pool.index.holds(blocks[-1]) and not before:
                self.ref.content[blocks[-1]] = tokens
        self.pool.free(reversed(blocks))
        for block in blocks:
            self.ref.refs[block] -= 1

    def pressure(self) -> None:
        count = self.rng.randrange(1, 6)
        if self.pool.can_allocate(count):
            blocks = self.pool.allocate(count)
            self.sync_evictions(blocks)
            self.pool.free(blocks)
            for block in blocks:
                self.ref.refs[block] -= 1

    def uncache(self) -> None:
        if self.ref.content:
            self.pool.uncache([self.rng.choice(sorted(self.ref.content))])
            self.forget_dropped()

    def check(self) -> None:
        referenced = {block for block, count in self.ref.refs.items() if count}
        assert all(self.pool.ref_count(block) == self.ref.refs.get(block, 0) for block in range(NUM_BLOCKS))
        assert self.pool.num_used_blocks == len(referenced)
        assert self.pool.num_free_blocks == NUM_BLOCKS - len(referenced), "an unreferenced block is not free"
        assert set(self.ref.content) == {block for block in range(NUM_BLOCKS) if self.pool.index.holds(block)}
        if self.radix:
            prefixes = set(self.ref.content.values())
            for prefix in prefixes:
                parent = prefix[:(len(prefix) - 1) // BS * BS]
                assert not parent or parent in prefixes, "a cached block is stranded behind an evicted parent"


@pytest.mark.parametrize("eviction", ["lru", "lfu", "cost"])
@pytest.mark.parametrize("policy", ["radix", "hash"])
@pytest.mark.parametrize("seed", range(12))
def test_random_interleavings_keep_the_invariants(policy: str, eviction: str, seed: int) -> None:
    rng = random.Random(seed)
    harness = Harness(policy, eviction, rng)
    for _ in range(300):
        operation = rng.random()
        if operation < 0.4:
            harness.admit()
        elif operation < 0.7 and harness.live:
            harness.release()
        elif operation < 0.8:
            # The plan in the making reports; what is inserted from now on is written by the next one.
            harness.step += 1
            harness.pool.index.settle(harness.step - 1)
            harness.pool.index.stamp(harness.step)
            harness.ref.settled = set(harness.ref.content)
        elif operation < 0.93:
            harness.pressure()
        else:
            harness.uncache()
        harness.check()
    while harness.live:
        harness.release()
    harness.check()
    assert harness.pool.num_used_blocks == 0 and all(harness.pool.ref_count(b) == 0 for b in range(NUM_BLOCKS))
