"""PrefixCache: the scheduler's side of automatic prefix caching -- lookups at admission, registering full
blocks, and the hit counters -- over the BlockManager's hash table.

Key design choice: a block is offered to the cache only once its tokens are all real (no placeholder) and
its KV is scheduled, so a hit never depends on a token the worker has not been told; readers of a block
still being written are safe because the worker executes plans in order (see `register_full_blocks`).
A hit must hold in every cache group (vLLM intersects the groups' hits): each KV table registers its blocks under
its own key, and a hit of n blocks needs a table reading the whole context to cache all n, a windowed table only
those its window reads after them (vLLM's sliding-window manager); a block a window freed before it was full is
never offered. A model with state layers also needs a snapshot of its state after block n (state_snapshots.py).
Usage: `hits = cache.lookup(request)`, `cache.take(request, hits)` at admission;
`cache.register_full_blocks(request)` whenever a request's computed or known tokens grow.
"""

from __future__ import annotations

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.request_state import FREED_BLOCK, RequestState
from rapid_llm.scheduler_proc.state_snapshots import StateSnapshots
from rapid_llm.utils.block_hash import BlockHash


def table_key(block_hash: BlockHash, table: int) -> BlockHash:
    """A block's key in KV table `table`: the same tokens cache different layers' KV in each table."""
    return block_hash if table == 0 else block_hash + table.to_bytes(4, "little")


class PrefixCache:
    def __init__(self, blocks: BlockManager, config: SchedulerConfig) -> None:
        self._blocks = blocks
        self.enabled = config.enable_prefix_caching
        # A model with state layers hits only where a snapshot of its state at the hit's end is kept.
        self.snapshots = (StateSnapshots(config.state_snapshots, config.block_size, config.state_snapshot_interval)
                          if config.recurrent_state and config.state_snapshots and self.enabled else None)
        self.hits_possible = not config.recurrent_state or self.snapshots is not None
        self.block_size = config.block_size
        self.windows = config.kv_windows
        self.queries = 0  # tokens looked up at admissions, since start
        self.hits = 0  # of those, tokens found cached

    def lookup(self, request: RequestState) -> list[int]:
        """The cached blocks a waiting request can start from (not taken yet): the same number of entries in each KV
        table, table 0's first; FREED_BLOCK where a windowed table need not hold the block (behind its window)."""
        if not self.serves(request):
            return []
        # At least one token is always computed, so that the step has logits to sample from; a
        # block that token falls in is written, and a block being written is never shared.
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes(max_blocks)[:max_blocks]
        # A table reading the whole context needs every block from the first: a prefix run, cut at the first miss.
        runs = {table: self._blocks.lookup(table_key(h, table) for h in hashes)
                for table, window in enumerate(self.windows) if window is None}
        num_hits = min((len(run) for run in runs.values()), default=max_blocks)
        windowed = {table: [self._blocks.cached_block(table_key(h, table)) for h in hashes[:num_hits]]
                    for table, window in enumerate(self.windows) if window is not None}
        # A windowed table needs only the blocks the next token's window reads, a state group the snapshot after the
        # last block: the longest hit they hold for.
        while num_hits and not self._holds(num_hits, windowed, hashes):
            num_hits -= 1
        hits: list[int] = []
        for table in range(len(self.windows)):
            if table in runs:
                hits += runs[table][:num_hits]
            else:
                first = self.first_read(table, num_hits)
                hits += [FREED_BLOCK] * first + windowed[table][first:num_hits]
        return hits

    def serves(self, request: RequestState) -> bool:
        """Whether the request may start from cached blocks at all."""
        # Cached tokens are never computed, so they would have no prompt logprobs (vLLM skips the cache too)
        # and no hidden states for mean pooling.
        return (self.enabled and self.hits_possible and request.params.prompt_logprobs is None
                and request.params.pooling != "mean")

    def _holds(self, num_hits: int, windowed: dict[int, list[int | None]], hashes: list[BlockHash]) -> bool:
        if any(None in found[self.first_read(table, num_hits):num_hits] for table, found in windowed.items()):
            return False
        return self.snapshots is None or self.snapshots.snapshot_of(hashes[num_hits - 1]) is not None

    def first_read(self, table: int, num_blocks: int) -> int:
        """The first block a table must hold for a request whose first `num_blocks` blocks are computed: what the
        scheduler has not freed behind the table's window."""
        window = self.windows[table]
        return 0 if window is None else max(0, num_blocks * self.block_size - window) // self.block_size

    def take(self, request: RequestState, hits: list[int]) -> None:
        """Start `request` from `hits` (ref counts +1; `lookup`'s layout) and count the admission's lookup."""
        num_blocks = len(hits) // len(self.windows)
        num_cached = num_blocks * self.block_size
        self._blocks.share(block for block in hits if block != FREED_BLOCK)
        request.clear_blocks()
        request.extend_blocks(hits)
        request.num_freed = [self.first_read(table, num_blocks) for table in range(len(self.windows))]
        request.num_registered_blocks = num_blocks
        request.num_computed_tokens = num_cached
        if self.snapshots is not None and num_blocks:
            request.state_load = self.snapshots.snapshot_of(request.block_hashes(num_blocks)[num_blocks - 1])
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        if self.enabled:
            # Counted per admission, like vLLM: a request resumed after preemption looks up again.
            self.queries += request.num_tokens
            self.hits += num_cached

    def register_full_blocks(self, request: RequestState) -> None:
        """Offer the request's newly full blocks to the prefix cache.

        A block qualifies once its tokens are all real (no placeholder) and its KV is scheduled: prompt
        blocks when planned, output blocks when the sampled ids arrive. Its KV may still be computed
        by a step in flight (or by the very step that plans to read it) when another request's plan
        reuses it. That is safe: the worker executes plans in order, and within a step every layer
        writes the new K/V of all sequences before any sequence attends, so a reader never runs ahead
        of the writer.
        """
        if not self.enabled or not self.hits_possible:
            return
        num_full = min(request.num_computed_tokens, request.num_known_tokens) // self.block_size
        if num_full <= request.num_registered_blocks:
            return
        hashes = request.block_hashes(num_full)
        for table, (block_ids, num_freed) in enumerate(zip(request.block_tables, request.num_freed)):
            # A block a sliding window freed before its tokens were all known is not offered (its id is gone).
            for index in range(max(request.num_registered_blocks, num_freed), num_full):
                self._blocks.cache_block(block_ids[index], table_key(hashes[index], table))
        request.num_registered_blocks = num_full
