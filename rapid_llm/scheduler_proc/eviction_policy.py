"""The order in which the prefix cache evicts its unreferenced blocks: lru, lfu or cost, O(log n) per eviction.

Key design choice: one binary heap with lazy deletion. A block's heap entry goes stale when the block is locked,
evicted or pushed again (its version moves on); stale entries are skipped when popped and dropped by a rebuild once
they outnumber the live ones, so a push, pop or removal costs O(log n) amortised -- never a rebuild per eviction.
- lru: the least recently used block first (the tick at which it was last released);
- lfu: the fewest hits first, the least recently used among equals; every admission that shares a block is a hit;
- cost: GreedyDual-Size-Frequency. A block's value is clock + (1 + hits) x its recompute cost (one block of memory
  each), the lowest evicted first, and the clock rises to each victim's value so that old values age out. The
  recompute cost of a block is the work of its tokens at its position (`recompute_cost`): a deep block, whose
  tokens attend to a long prefix, is worth more than a shallow one with as many hits.
Usage: `queue.reset(block, start, num_tokens)` for new content, `queue.hit(block)` per admission sharing it,
`queue.push(block)` when it becomes evictable, `queue.remove(block)` when it stops being, `queue.pop()` a victim.
"""

from __future__ import annotations

import heapq

from rapid_llm.config.scheduler_config import EVICTION_POLICIES

# Linear work per token, in attention (query, key) pairs: the cost policy's weight of a block's own tokens against
# the prefix they attend to (a 1B Llama's 2 x parameters over 4 x layers x hidden FLOPs per pair is about 15000).
_PAIRS_PER_TOKEN = 16384


def recompute_cost(start: int, num_tokens: int) -> float:
    """The work of recomputing tokens [start, start + num_tokens): linear layers plus causal attention pairs."""
    pairs = num_tokens * start + num_tokens * (num_tokens + 1) // 2
    return num_tokens + pairs / _PAIRS_PER_TOKEN


class EvictionQueue:
    """The evictable blocks of one cache, ordered by `policy`."""

    def __init__(self, num_blocks: int, policy: str = "lru") -> None:
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r}; choose one of {', '.join(EVICTION_POLICIES)}")
        self.policy = policy
        self._heap: list[tuple[float, int, int, int]] = []  # (priority, tick, block, version)
        self._version = [0] * num_blocks
        self._queued = [False] * num_blocks
        self._hits = [0] * num_blocks
        self._cost = [1.0] * num_blocks
        self._tick = 0
        self._clock = 0.0  # the cost policy's aging floor
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def __contains__(self, block: int) -> bool:
        return self._queued[block]

    def reset(self, block: int, start: int, num_tokens: int) -> None:
        """The block caches new content: tokens [start, start + num_tokens) of some sequence, no hits yet."""
        self._hits[block] = 0
        self._cost[block] = recompute_cost(start, num_tokens)

    def hit(self, block: int) -> None:
        self._hits[block] += 1

    def push(self, block: int) -> None:
        """The block became evictable (it is not queued)."""
        if self._queued[block]:
            raise ValueError(f"block {block} is evictable already")
        self._tick += 1
        self._version[block] += 1
        self._queued[block] = True
        self._live += 1
        heapq.heappush(self._heap, (self._priority(block), self._tick, block, self._version[block]))

    def remove(self, block: int) -> None:
        """The block stopped being evictable (locked, or its content dropped); its entry goes stale."""
        if self._queued[block]:
            self._version[block] += 1
            self._queued[block] = False
            self._live -= 1
            if len(self._heap) > 2 * self._live + 64:
                self._heap = [entry for entry in self._heap if self._version[entry[2]] == entry[3]]
                heapq.heapify(self._heap)

    def pop(self) -> int:
        """Take the block to evict next out of the queue."""
        while self._heap:
            priority, _, block, version = heapq.heappop(self._heap)
            if self._version[block] == version:
                self._queued[block] = False
                self._live -= 1
                if self.policy == "cost":
                    self._clock = priority
                return block
        raise ValueError("no evictable block")

    def _priority(self, block: int) -> float:
        if self.policy == "lru":
            return self._tick
        if self.policy == "lfu":
            return self._hits[block]
        return self._clock + (1 + self._hits[block]) * self._cost[block]
