"""The scheduler's half of the KV offload tier: which evicted blocks are saved where, and prefix hits found there.

Key design choice: the tier's slots are a `BlockManager` of their own keyed by the blocks' chained hashes (the hash
index, LRU: the slot least recently saved or loaded is overwritten first), so the scheduler knows exactly what the
worker's store holds without asking it. A full block the prefix cache evicts is saved unless the tier has its hash
already; an admission's lookup continues its prefix hit's run of hashes into the tier, and the blocks found there
are loaded into fresh KV blocks at the start of the step that admits it (worker_proc/kv_tier.py orders a plan's
saves and loads so that both may name one block or slot). When the worker reports the tier failed, it is dropped
whole and serving goes on without it.
Usage: `tier.save` is the prefix-cache index's eviction hook; `tier.lookup(hashes)` and `tier.load(slots, blocks)`
at admission; `tier.prefetch(slots)` for a request that waits; `tier.take_plan()` for each plan.
"""

from __future__ import annotations

import logging

from rapid_llm.ipc.messages import TierLoad, TierSave
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.utils.block_hash import BlockHash

logger = logging.getLogger(__name__)


class OffloadTier:
    def __init__(self, num_slots: int, block_size: int) -> None:
        self._slots = BlockManager(num_slots, block_size)
        self.enabled = True
        self._saves: list[TierSave] = []
        self._loads: list[TierLoad] = []
        self._prefetch: list[int] = []
        self._prefetched: set[int] = set()  # since their last save
        self.num_saved = 0  # blocks, since start
        self.num_loaded = 0

    def save(self, block: int, block_hash: BlockHash) -> None:
        """The prefix cache evicts `block`, which holds the full block `block_hash`: keep it in the tier."""
        if not self.enabled or self._slots.cached_block(block_hash) is not None:
            return
        slot = self._slots.allocate(1)[0]
        self._slots.cache_block(slot, block_hash)
        self._slots.free([slot])
        self._prefetched.discard(slot)
        self._saves.append(TierSave(block, slot))
        self.num_saved += 1

    def lookup(self, block_hashes: list[BlockHash]) -> list[int]:
        """The tier's slots holding the longest run of `block_hashes` from the first one; not a slot this plan saves
        into (the worker loads a plan's slots before it keeps the plan's saves)."""
        run = self._slots.lookup(block_hashes) if self.enabled else []
        saved_now = {save.slot for save in self._saves}
        for index, slot in enumerate(run):
            if slot in saved_now:
                return run[:index]
        return run

    def load(self, slots: list[int], blocks: list[int]) -> None:
        """Load `slots` into `blocks` at the next step's start; each slot becomes the most recently used."""
        self._slots.share(slots)
        self._slots.free(slots)
        self._loads += [TierLoad(slot, block) for slot, block in zip(slots, blocks)]
        self.num_loaded += len(slots)

    def prefetch(self, slots: list[int]) -> None:
        """A waiting request will load these: the worker may read them ahead (each once)."""
        fresh = [slot for slot in slots if slot not in self._prefetched]
        self._prefetched.update(fresh)
        self._prefetch += fresh

    def take_plan(self) -> tuple[list[TierSave], list[TierLoad], list[int]]:
        """The saves, loads and prefetches for the plan being sent."""
        plan = self._saves, self._loads, self._prefetch
        self._saves, self._loads, self._prefetch = [], [], []
        return plan

    def disable(self, reason: str) -> None:
        """The worker's store failed: forget the tier (what is planned already still runs)."""
        if self.enabled:
            logger.warning("KV offload tier off: %s", reason)
            self.enabled = False
            self.reset()

    def reset(self) -> None:
        """Forget every saved block (a cache flush)."""
        self._slots.reset_cache()
        self._prefetched.clear()
