"""The prefix cache's index: which KV blocks cache which tokens, and which of them to evict next.

`CacheIndex` is the interface the block manager drives: `insert` (a full block under its chained hash),
`insert_partial` (a block only partly filled), `lookup` / `match_partial` (match), `lock` / `unlock` (a block's
first reference taken, its last one dropped), `evict`, `remove`, `reset`, and the hit counters. `HashIndex` is the
block-granular hash table vLLM keeps (`--prefix-cache-policy hash`): any unreferenced cached block may be evicted, so
evicting the middle of a prefix strands its tail until the tail is evicted too, and a partly filled block is never
kept. The radix tree (`radix_index.py`) is the other implementation. Key design choice: the index owns only cached
blocks; reference counts and the blocks that cache nothing stay in the block manager. Usage: `make_index` in
block_manager.py builds the one `--prefix-cache-policy` names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rapid_llm.scheduler_proc.eviction_policy import EvictionQueue
from rapid_llm.utils.block_hash import BlockHash

class CacheIndex:
    """The interface, with what both implementations share: the eviction queue and the lock state of blocks."""

    # Whether `match_partial` can find anything (a token-granular hit that is copied into a fresh block).
    partial_hits = False

    def __init__(self, num_blocks: int, eviction: str = "lru") -> None:
        self.queue = EvictionQueue(num_blocks, eviction)
        self.num_evictions = 0
        # Called with each evicted full block and its hash before its content is dropped (the offload tier).
        self.on_evict: Callable[[int, BlockHash], None] | None = None

    @property
    def num_unreferenced(self) -> int:
        """Cached blocks nobody references: each can be evicted, if need be after others."""
        return len(self.queue)

    def holds(self, block: int) -> bool:
        """Whether the block caches something."""
        raise NotImplementedError

    def hash_of(self, block: int) -> BlockHash | None:
        """The hash of the full block it caches (None: a partial block, or nothing)."""
        raise NotImplementedError

    def insert(self, block: int, block_hash: BlockHash, parent: BlockHash | None, tokens: Sequence[int],
               start: int, namespace: str | None = None) -> None:
        """Cache a full block in use (locked) holding `tokens` at positions from `start`, after the block `parent`
        (None: the first, of the sequences under `namespace`: the extra cache key, such as a LoRA adapter's, that
        the chained hashes cover). A second block with the same content stays uncached."""
        raise NotImplementedError

    def insert_partial(self, block: int, parent: BlockHash | None, tokens: Sequence[int], start: int,
                       namespace: str | None = None) -> bool:
        """Offer a block in use whose first len(tokens) positions hold KV; whether it is kept."""
        return False

    def cached_block(self, block_hash: BlockHash) -> int | None:
        """The block caching the full block with this hash, if any."""
        raise NotImplementedError

    def lookup(self, block_hashes: Iterable[BlockHash]) -> list[int]:
        """The cached blocks of the longest run of `block_hashes` from the first one."""
        hits = []
        for block_hash in block_hashes:
            block = self.cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def match_partial(self, parent: BlockHash | None, tokens: Sequence[int],
                      namespace: str | None = None) -> tuple[int, int] | None:
        """(block, n): a cached block after `parent` whose first n >= 1 positions hold `tokens[:n]`, n the longest;
        only a block whose writing step has reported (`settle`): the copy runs before the step's forward, and a
        failed writer's blocks leave the cache when its result arrives, before they could be copied."""
        return None

    def stamp(self, step_id: int) -> None:
        """Blocks inserted from now on have their KV written by step `step_id` at the latest."""

    def settle(self, step_id: int) -> None:
        """Every step up to `step_id` has reported: the blocks they wrote may be copied."""

    def lock(self, block: int) -> None:
        """The block's first reference is taken: it cannot be evicted."""
        self.queue.remove(block)

    def unlock(self, block: int) -> None:
        """Its last reference is dropped; it caches something (`holds`)."""
        self.queue.push(block)

    def hit(self, block: int) -> None:
        """An admission shares the block."""
        self.queue.hit(block)

    def evict(self) -> list[int]:
        """Drop the content of the next victim and return it, then any other blocks that stopped caching because
        of it (the block manager keeps the unreferenced ones spare)."""
        block = self.queue.pop()
        self._evicting(block)
        self._forget(block)
        self.num_evictions += 1
        return [block]

    def remove(self, block: int) -> list[int]:
        """Forget the block's content (its KV is not what the index says) and return every block that stops caching
        anything because of it."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget everything (no block is locked)."""
        raise NotImplementedError

    def _evicting(self, block: int) -> None:
        block_hash = self.hash_of(block)
        if self.on_evict is not None and block_hash is not None:
            self.on_evict(block, block_hash)

    def _forget(self, block: int) -> None:
        """Drop a victim's content (it has left the queue)."""
        raise NotImplementedError


class HashIndex(CacheIndex):
    """Full blocks under their chained hashes; every unreferenced one is evictable."""

    def __init__(self, num_blocks: int, eviction: str = "lru") -> None:
        super().__init__(num_blocks, eviction)
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._block_of: dict[BlockHash, int] = {}

    def holds(self, block: int) -> bool:
        return self._hash_of[block] is not None

    def hash_of(self, block: int) -> BlockHash | None:
        return self._hash_of[block]

    def insert(self, block: int, block_hash: BlockHash, parent: BlockHash | None, tokens: Sequence[int],
               start: int, namespace: str | None = None) -> None:
        if self._hash_of[block] is not None:
            raise ValueError(f"KV block {block} is cached already")
        if block_hash not in self._block_of:
            self._block_of[block_hash] = block
            self._hash_of[block] = block_hash
            self.queue.reset(block, start, len(tokens))

    def cached_block(self, block_hash: BlockHash) -> int | None:
        return self._block_of.get(block_hash)

    def remove(self, block: int) -> list[int]:
        if self._hash_of[block] is None:
            return []
        self.queue.remove(block)
        self._forget(block)
        return [block]

    def reset(self) -> None:
        for block in list(self._block_of.values()):
            self.queue.remove(block)
        self._block_of.clear()
        self._hash_of = [None] * len(self._hash_of)

    def _forget(self, block: int) -> None:
        del self._block_of[self._hash_of[block]]
        self._hash_of[block] = None

