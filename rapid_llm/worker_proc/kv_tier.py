"""The KV cache's second tier on the worker: a bounded store of evicted blocks, in host memory or in a file on disk.

The scheduler decides everything (scheduler_proc/offload_tier.py): which evicted block is saved into which slot,
which slot is loaded into which block, which slots to prefetch. A plan's tier work runs at the step's start, in
an order that lets one plan both evict a block and reuse its memory, and both load a slot and overwrite it:
`stage` reads the evicted blocks' bytes (before anything writes them), `load` writes slots into blocks (before
the new saves overwrite a slot), `commit` hands the staged bytes to the store. Key design choice: the disk store
writes in a thread of its own, so a step never waits for the disk; a slot whose write is still queued is read
from its staged bytes. Blocks move through the KV connector's byte seam (`KVCache.read_block_rows` / `write_block_rows`).
A disk that is unwritable at start or fills up later costs the tier, never a request: the error is logged, the
scheduler told (it stops using the tier), and bytes not written stay readable from memory.
Usage: `tier = open_tier(kv_cache, num_bytes, path)` (None: no tier), then per plan `staged = tier.stage(saves)`,
`tier.load(loads)`, `tier.commit(staged)`, `tier.prefetch(slots)`; `tier.take_error()` for the result.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path

import torch

from rapid_llm.worker_proc.kv_cache import KVCache

logger = logging.getLogger(__name__)


def _tensor_bytes(cache: KVCache) -> list[int]:
    """The bytes one block takes in each distinct KV tensor."""
    return [cache.read_blocks(tensor, [0]).numel() for tensor in range(cache.num_tensors)]


class KVTier:
    """`num_slots` slots of one block's bytes over every distinct KV tensor; where they are kept is the subclass's."""

    def __init__(self, cache: KVCache, num_slots: int) -> None:
        self.cache = cache
        self.num_slots = num_slots
        sizes = _tensor_bytes(cache)
        self._offsets = [sum(sizes[:index]) for index in range(len(sizes) + 1)]
        self.slot_bytes = self._offsets[-1]
        self._error: str | None = None
        self._reported = False

    def stage(self, saves: list[tuple[int, int]]) -> list[tuple[int, torch.Tensor]]:
        """(block, slot) pairs: read the blocks' bytes now, before this step's copies, zeroing and loads."""
        if not saves:
            return []
        blocks = [block for block, _ in saves]
        parts = [self.cache.read_block_rows(tensor, blocks) for tensor in range(self.cache.num_tensors)]
        rows = torch.cat(parts, dim=1)
        return [(slot, rows[index]) for index, (_, slot) in enumerate(saves)]

    def load(self, loads: list[tuple[int, int]]) -> None:
        """(slot, block) pairs: write each slot's bytes into its block."""
        if not loads:
            return
        rows = torch.stack([self._read(slot) for slot, _ in loads])
        blocks = [block for _, block in loads]
        for tensor in range(self.cache.num_tensors):
            self.cache.write_block_rows(tensor, blocks, rows[:, self._offsets[tensor]:self._offsets[tensor + 1]])

    def commit(self, staged: list[tuple[int, torch.Tensor]]) -> None:
        """Keep the staged bytes in their slots."""
        for slot, row in staged:
            self._write(slot, row)

    def prefetch(self, slots: list[int]) -> None:
        """Slots a waiting request will load: bring them close (nothing to do in memory)."""

    def take_error(self) -> str:
        """The store's failure, once (empty: none, or already reported)."""
        if self._error is None or self._reported:
            return ""
        self._reported = True
        return self._error

    def _read(self, slot: int) -> torch.Tensor:
        raise NotImplementedError

    def _write(self, slot: int, row: torch.Tensor) -> None:
        raise NotImplementedError


class HostKVTier(KVTier):
    """Slots in one host tensor (pinned when the cache is on a GPU)."""

    def __init__(self, cache: KVCache, num_slots: int) -> None:
        super().__init__(cache, num_slots)
        self._rows = torch.empty(num_slots, self.slot_bytes, dtype=torch.uint8,
                                 pin_memory=cache.device.type == "cuda")

    def _read(self, slot: int) -> torch.Tensor:
        return self._rows[slot]

    def _write(self, slot: int, row: torch.Tensor) -> None:
        self._rows[slot] = row


class DiskKVTier(KVTier):
    """Slots in one preallocated file under `directory`; a writer thread and a prefetch thread do the I/O."""

    def __init__(self, cache: KVCache, num_slots: int, directory: str) -> None:
        super().__init__(cache, num_slots)
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"rapid_llm-kv-tier-{os.getpid()}.bin"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # Claim the space now: a disk too small for the tier fails here, not in the middle of serving.
            os.posix_fallocate(self._fd, 0, num_slots * self.slot_bytes)
        except OSError:
            self.close()
            raise
        self._lock = threading.Lock()
        self._pending: dict[int, torch.Tensor] = {}  # staged, not yet on disk (or never, after a failure)
        self._prefetched: dict[int, torch.Tensor] = {}
        self._writes: queue.SimpleQueue[tuple[int, torch.Tensor] | None] = queue.SimpleQueue()
        self._reads: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._write_loop, name="kv-tier-writer", daemon=True),
                         threading.Thread(target=self._prefetch_loop, name="kv-tier-prefetch", daemon=True)]
        for thread in self._threads:
            thread.start()

    def prefetch(self, slots: list[int]) -> None:
        for slot in slots:
            self._reads.put(slot)

    def close(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)

    def _read(self, slot: int) -> torch.Tensor:
        with self._lock:
            row = self._pending.get(slot)
            if row is None:
                row = self._prefetched.pop(slot, None)
        return row if row is not None else self._pread(slot)

    def _pread(self, slot: int) -> torch.Tensor:
        data = os.pread(self._fd, self.slot_bytes, slot * self.slot_bytes)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _write(self, slot: int, row: torch.Tensor) -> None:
        with self._lock:
            self._pending[slot] = row
            self._prefetched.pop(slot, None)
        if self._error is None:
            self._writes.put((slot, row))

    def _write_loop(self) -> None:
        while (item := self._writes.get()) is not None:
            slot, row = item
            if self._error is not None:
                continue
            try:
                os.pwrite(self._fd, row.numpy(), slot * self.slot_bytes)
            except OSError as error:
                # The bytes stay pending, so the loads already planned still read them.
                self._error = f"the KV offload tier at {self.path} failed to write ({error}); serving goes on " \
                              "without it"
                logger.warning(self._error)
                continue
            with self._lock:
                if self._pending.get(slot) is row:
                    del self._pending[slot]

    def _prefetch_loop(self) -> None:
        while (slot := self._reads.get()) is not None:
            with self._lock:
                if slot in self._pending or slot in self._prefetched:
                    continue
            row = self._pread(slot)
            with self._lock:
                # A save that arrived meanwhile wins; a bounded read-ahead (one tier's worth at most).
                if slot not in self._pending and len(self._prefetched) < self.num_slots:
                    self._prefetched[slot] = row


def open_tier(cache: KVCache, num_bytes: int | None, path: str | None) -> KVTier | None:
    """The tier `--kv-offload-size` / `--kv-offload-path` ask for; None when none is asked for or it cannot be
    opened (logged: serving goes on without it)."""
    if not num_bytes:
        return None
    slot_bytes = sum(_tensor_bytes(cache))
    num_slots = num_bytes // slot_bytes
    if num_slots < 1:
        logger.warning("--kv-offload-size %d B holds no KV block (%d B each); no offload tier", num_bytes, slot_bytes)
        return None
    if path is None:
        return HostKVTier(cache, num_slots)
    try:
        return DiskKVTier(cache, num_slots, path)
    except OSError as error:
        logger.warning("the KV offload tier cannot use %s (%s); serving goes on without it", path, error)
        return None
