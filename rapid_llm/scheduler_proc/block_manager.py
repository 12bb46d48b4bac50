"""Paged KV block pool: a FIFO free list plus a reference count per block.

Blocks are taken and returned by reference count, so a later prefix cache can share one block
between requests (and keep freed blocks around for reuse) without changing this interface.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class BlockManager:
    """Hands out the ids [0, num_blocks) of the worker's KV cache blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO: a just-freed block is reused last, so a later prefix cache keeps hits longest.
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """How many blocks hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free blocks, each with reference count 1."""
        if num_blocks < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num_blocks})")
        if num_blocks > len(self._free):
            raise ValueError(f"cannot allocate {num_blocks} KV blocks: only {len(self._free)} are free")
        block_ids = [self._free.popleft() for _ in range(num_blocks)]
        for block_id in block_ids:
            self._ref_counts[block_id] = 1
        return block_ids

    def add_ref(self, block_ids: Iterable[int]) -> None:
        """Share blocks that are already in use: each needs one more `free` before it is free again."""
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                raise ValueError(f"KV block {block_id} is free and cannot be shared")
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; a block whose count reaches 0 becomes free."""
        for block_id in block_ids:
            if self.ref_count(block_id) == 0:
                raise ValueError(f"KV block {block_id} freed twice")
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                self._free.append(block_id)

    def ref_count(self, block_id: int) -> int:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"KV block id {block_id} is outside [0, {self.num_blocks})")
        return self._ref_counts[block_id]
