"""Paged KV block pool: reference counts plus an automatic prefix cache, sharing one LRU free queue.

Key design choice: a full block whose KV is known is registered under its content hash
(`block_hash.py`). When its last reference is dropped it stays cached in the free queue, reusable
by a later request until its memory is needed. Allocation takes the head of the queue, where
blocks that cache nothing sit; cached blocks follow from least to most recently freed, and taking
one evicts it (drops its hash). So "free" counts every block `allocate` can hand out, cached or not.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from rapid_llm.utils.block_hash import BlockHash


class BlockManager:
    """Hands out the ids [0, num_blocks) of the worker's KV cache blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        # Unreferenced blocks in the order they are reused (an ordered set: O(1) removal of a hit).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._block_of: dict[BlockHash, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request references, cached or not: what `allocate` can hand out."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one request."""
        return self.num_blocks - len(self._free)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """How many blocks hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks from the head of the free queue, each with reference count 1."""
        if num_blocks < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num_blocks})")
        if num_blocks > len(self._free):
            raise ValueError(f"cannot allocate {num_blocks} KV blocks: only {len(self._free)} are free")
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            self._evict(block_id)
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def share(self, block_ids: Iterable[int]) -> None:
        """Take one more reference to each block: one in use, or a free one that still caches KV."""
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                if self._hash_of[block_id] is None:
                    raise ValueError(f"KV block {block_id} is free and caches nothing, so it cannot be shared")
                del self._free[block_id]
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; an unreferenced block goes back to the free queue.

        Pass a request's blocks last first: a cached prefix is only usable from its start, so its tail
        should be evicted before its head.
        """
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                raise ValueError(f"KV block {block_id} freed twice")
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free[block_id] = None
                if self._hash_of[block_id] is None:
                    # It caches nothing, so it is reused before any block that does.
                    self._free.move_to_end(block_id, last=False)

    def ref_count(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"KV block id {block_id} is outside [0, {self.num_blocks})")
        return self._ref_counts[block_id]

    # ---- prefix cache ------------------------------------------------------------------------

    def cache_block(self, block_id: int, block_hash: BlockHash) -> None:
        """Register a full block in use under the hash of its content, for later requests to reuse.

        If another block already caches the same content, this one stays unregistered and is freed
        like any other; the registered copy keeps serving hits.
        """
        if self.ref_count(block_id) == 0:
            raise ValueError(f"KV block {block_id} is free; only a block in use can be cached")
        if self._hash_of[block_id] is not None:
            raise ValueError(f"KV block {block_id} is cached already")
        if block_hash not in self._block_of:
            self._block_of[block_hash] = block_id
            self._hash_of[block_id] = block_hash

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block caching `block_hash`, if any (not taken)."""
        return self._block_of.get(block_hash)

    def lookup(self, block_hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of `block_hashes` from the first one (not taken yet)."""
        hits = []
        for block_hash in block_hashes:
            block_id = self._block_of.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_unreferenced(self, block_ids: Iterable[int]) -> int:
        """How many of the blocks are free: sharing them leaves that many fewer to allocate."""
        return sum(1 for block_id in block_ids if self.ref_count(block_id) == 0)

    def uncache(self, block_ids: Iterable[int]) -> None:
        """Forget the cached content of these blocks (their KV is not what their hash says)."""
        for block_id in block_ids:
            self._evict(block_id)

    def reset_cache(self) -> None:
        """Forget every cached block; only while no block is in use."""
        if self.num_used_blocks:
            raise ValueError(f"cannot reset the prefix cache while {self.num_used_blocks} KV blocks are in use")
        self._block_of.clear()
        self._hash_of = [None] * self.num_blocks

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of[block_id]
        if block_hash is not None:
            del self._block_of[block_hash]
            self._hash_of[block_id] = None
