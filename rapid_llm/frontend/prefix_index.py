"""PrefixIndex: the router's approximate picture of one replica's prefix cache, as an LRU set of block hashes.

Key design choice: the router never asks the scheduler what it caches; it remembers the full blocks of the
prompts it sent to the replica, hashed with the scheduler's own chained block hash
(`utils/block_hash.py`, no extra key), so one hash stands for a block and its whole prefix and a
prompt's match is the number of leading hashes present. Capacity is the replica's KV blocks: the oldest
unused hashes fall out first, as the replica's own cache evicts least recently used blocks. It is an
approximation: the replica may have evicted earlier (running requests hold blocks) or cached output tokens.
"""

from __future__ import annotations

from collections import OrderedDict

from rapid_llm.utils.block_hash import BlockHash, hash_block


class PrefixIndex:
    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        if block_size < 1 or capacity_blocks < 1:
            raise ValueError(f"a prefix index needs block_size and capacity >= 1, got {block_size}, "
                             f"{capacity_blocks}")
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._hashes: OrderedDict[BlockHash, None] = OrderedDict()

    def block_hashes(self, token_ids: list[int]) -> list[BlockHash]:
        """The chained hashes of the prompt's full blocks."""
        hashes: list[BlockHash] = []
        parent = None
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            parent = hash_block(parent, token_ids[start:start + self.block_size], None)
            hashes.append(parent)
        return hashes

    def match(self, hashes: list[BlockHash]) -> int:
        """How many leading blocks of `hashes` this replica is believed to cache."""
        matched = 0
        for block_hash in hashes:
            if block_hash not in self._hashes:
                break
            matched += 1
        return matched

    def insert(self, hashes: list[BlockHash]) -> None:
        """Remember the blocks (most recently used last), evicting the least recently used beyond capacity."""
        for block_hash in hashes:
            self._hashes[block_hash] = None
            self._hashes.move_to_end(block_hash)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._hashes)
