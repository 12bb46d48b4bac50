"""Paged KV block pool: reference counts, the blocks that cache nothing, and a prefix-cache index for the rest.

Key design choice: a block whose KV is known is offered to the index (`cache_index.py`: the hash table, or the
radix tree of `radix_index.py`). When its last reference is dropped it stays cached, reusable by a later request
until its memory is needed: `allocate` takes blocks that cache nothing first, then asks the index to evict one
(in the order of `--eviction-policy`). So "free" counts every block `allocate` can hand out, cached or not.
Usage: `BlockManager(num_blocks, block_size, make_index(policy, num_blocks, eviction))`; `allocate`, `share`,
`free` for references; `cache_block`, `lookup`, `match_partial` for the prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from rapid_llm.scheduler_proc.cache_index import CacheIndex, HashIndex
from rapid_llm.scheduler_proc.radix_index import RadixIndex
from rapid_llm.config.scheduler_config import PREFIX_CACHE_POLICIES
from rapid_llm.utils.block_hash import BlockHash

def make_index(policy: str, num_blocks: int, eviction: str = "lru") -> CacheIndex:
    """The index `--prefix-cache-policy` names, evicting in `--eviction-policy` order."""
    if policy == "hash":
        return HashIndex(num_blocks, eviction)
    if policy == "radix":
        return RadixIndex(num_blocks, eviction)
    raise ValueError(f"unknown prefix cache policy {policy!r}; choose one of {', '.join(PREFIX_CACHE_POLICIES)}")


class BlockManager:
    """Hands out the ids [0, num_blocks) of the worker's KV cache blocks."""

    def __init__(self, num_blocks: int, block_size: int, index: CacheIndex | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.index = index if index is not None else HashIndex(num_blocks)
        self._ref_counts = [0] * num_blocks
        self._num_referenced = 0
        # Unreferenced blocks that cache nothing, reused first (an ordered set: O(1) removal).
        self._spare: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request references, cached or not: what `allocate` can hand out."""
        return len(self._spare) + self.index.num_unreferenced

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one request."""
        return self._num_referenced

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """How many blocks hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks, each with reference count 1: spare ones first, then evicted ones."""
        if num_blocks < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num_blocks})")
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} KV blocks: only {self.num_free_blocks} are free")
        block_ids = []
        for _ in range(num_blocks):
            if not self._spare:
                for dropped in self.index.evict():
                    if self._ref_counts[dropped] == 0:
                        self._spare[dropped] = None
            block_id = self._spare.popitem(last=False)[0]
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        self._num_referenced += num_blocks
        return block_ids

    def share(self, block_ids: Iterable[int]) -> None:
        """Take one more reference to each block: one in use, or a free one that still caches KV."""
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                if not self.index.holds(block_id):
                    raise ValueError(f"KV block {block_id} is free and caches nothing, so it cannot be shared")
                self.index.lock(block_id)
                self._num_referenced += 1
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; an unreferenced block is spare, or evictable if it caches KV.

        Pass a request's blocks last first: a cached prefix is only usable from its start, so under LRU its tail
        should be evicted before its head.
        """
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                raise ValueError(f"KV block {block_id} freed twice")
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._num_referenced -= 1
                if self.index.holds(block_id):
                    self.index.unlock(block_id)
                else:
                    self._spare[block_id] = None
                    self._spare.move_to_end(block_id, last=False)

    def ref_count(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"KV block id {block_id} is outside [0, {self.num_blocks})")
        return self._ref_counts[block_id]

    # ---- prefix cache ------------------------------------------------------------------------

    def cache_block(self, block_id: int, block_hash: BlockHash, parent: BlockHash | None = None,
                    tokens: Sequence[int] = (), start: int = 0, namespace: str | None = None) -> None:
        """Register a full block in use under the hash of its content (`tokens` at positions from `start`, after
        the block hashed `parent`, under the extra cache key `namespace`), for later requests to reuse.

        If another block already caches the same content, this one stays unregistered and is freed
        like any other; the registered copy keeps serving hits.
        """
        if self.ref_count(block_id) == 0:
            raise ValueError(f"KV block {block_id} is free; only a block in use can be cached")
        self.index.insert(block_id, block_hash, parent, tokens, start, namespace)

    def cache_partial(self, block_id: int, parent: BlockHash | None, tokens: Sequence[int], start: int,
                      namespace: str | None = None) -> None:
        """Offer a block in use whose first len(tokens) positions hold KV (the index may keep it)."""
        if self.ref_count(block_id) == 0:
            raise ValueError(f"KV block {block_id} is free; only a block in use can be cached")
        self.index.insert_partial(block_id, parent, tokens, start, namespace)

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block caching `block_hash`, if any (not taken)."""
        return self.index.cached_block(block_hash)

    def lookup(self, block_hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of `block_hashes` from the first one (not taken yet)."""
        return self.index.lookup(block_hashes)

    def match_partial(self, parent: BlockHash | None, tokens: Sequence[int],
                      namespace: str | None = None) -> tuple[int, int] | None:
        """(block, n): a cached block after `parent` holding `tokens[:n]`, n >= 1 the longest (radix index only)."""
        return self.index.match_partial(parent, tokens, namespace)

    def count_hits(self, block_ids: Iterable[int]) -> None:
        """An admission reuses these blocks (what the LFU and cost eviction policies count)."""
        for block_id in block_ids:
            self.index.hit(block_id)

    def num_unreferenced(self, block_ids: Iterable[int]) -> int:
        """How many of the blocks are free: sharing them leaves that many fewer to allocate."""
        return sum(1 for block_id in block_ids if self.ref_count(block_id) == 0)

    def uncache(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (their KV is not what their hash says)."""
        for block_id in block_ids:
            for dropped in self.index.remove(block_id):
                if self._ref_counts[dropped] == 0:
                    self._spare[dropped] = None

    def reset_cache(self) -> None:
        """Forget every cached block; only while no block is in use."""
        if self.num_used_blocks:
            raise ValueError(f"cannot reset the prefix cache while {self.num_used_blocks} KV blocks are in use")
        self.index.reset()
        self._spare = OrderedDict.fromkeys(range(self.num_blocks))
