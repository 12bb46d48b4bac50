"""State snapshots: the scheduler's pool of the worker's snapshot rows, which let a model with state layers (short
conv, recurrent) start a request from a prefix-cache hit.

Key design choice: a snapshot is the state after a full block, kept under that block's chained hash -- the same
key as the KV -- in a `BlockManager` of its own (reference counts, LRU eviction, hash table). A chunk keeps the
state at every `interval_blocks`-th block boundary of known tokens it passes (--state-snapshot-interval), and at
the last boundary before its request's last token (what a repeat of the prompt hits); the layers write those
states during the forward, at any position inside the chunk, so no chunk is cut for them. A snapshot is registered only once the
step's result arrives (a step loads before its forward, so a request planned into the same step must not see one
that step writes). A hit is the longest KV hit whose last block has a snapshot (PrefixCache.lookup).
Usage: `saves_for` per chunk; `commit` with each result; `snapshot_of(hash)` at admission.
"""

from __future__ import annotations

from typing import NamedTuple

from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.utils.block_hash import BlockHash


class SnapshotSave(NamedTuple):
    snapshot: int
    block_hash: BlockHash
    slot: int  # the slot whose state is saved (a failed one's snapshot is not kept)
    position: int  # the state after this many tokens


class StateSnapshots:
    def __init__(self, num_snapshots: int, block_size: int, interval_blocks: int) -> None:
        self._pool = BlockManager(num_snapshots, block_size)
        self._pending: set[BlockHash] = set()  # saved by steps in flight
        self.block_size = block_size
        self.stride = interval_blocks * block_size

    def snapshot_of(self, block_hash: BlockHash) -> int | None:
        """The snapshot of the state after the block whose hash this is, if one is kept."""
        return self._pool.cached_block(block_hash)

    def saves_for(self, request: RequestState, start: int, end: int) -> list[SnapshotSave]:
        """Snapshots for the states a chunk computing tokens [start, end) passes: every `interval_blocks` blocks
        and at the last block boundary before the request's last token (what a repeat of it hits)."""
        last = (request.num_tokens - 1) // self.block_size * self.block_size
        positions = set(range((start // self.stride + 1) * self.stride, end + 1, self.stride))
        if start < last <= end:
            positions.add(last)
        return [save for position in sorted(positions) if (save := self._save_at(request, position)) is not None]

    def _save_at(self, request: RequestState, position: int) -> SnapshotSave | None:
        """A snapshot for the state after the request's first `position` tokens, when they are known and not kept
        yet and a snapshot is free (the least recently used cached one is evicted)."""
        num_blocks = position // self.block_size
        if num_blocks == 0 or position > request.num_known_tokens or request.slot is None:
            return None
        block_hash = request.block_hashes(num_blocks)[num_blocks - 1]
        if block_hash in self._pending or self.snapshot_of(block_hash) is not None or not self._pool.can_allocate(1):
            return None
        self._pending.add(block_hash)
        return SnapshotSave(self._pool.allocate(1)[0], block_hash, request.slot, position)

    def commit(self, saves: list[SnapshotSave], failed_slots: set[int]) -> None:
        """A step's saves are done: keep each under its hash (unless its slot failed) and return it to the pool."""
        for save in saves:
            self._pending.discard(save.block_hash)
            if save.slot not in failed_slots:
                self._pool.cache_block(save.snapshot, save.block_hash)
            self._pool.free([save.snapshot])

    def reset(self) -> None:
        """Forget every kept snapshot (a cache flush); those steps in flight still save stay theirs."""
        if not self._pool.num_used_blocks:
            self._pool.reset_cache()
