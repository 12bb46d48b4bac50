"""PrefixCache: the scheduler's side of automatic prefix caching -- lookups at admission, registering blocks, and
the hit counters -- over the BlockManager's index (the hash table or the radix tree, `--prefix-cache-policy`).

Key design choice: a block is offered to the cache only once its tokens are all real (no placeholder) and
its KV is scheduled, so a hit never depends on a token the worker has not been told; readers of a block
still being written are safe because the worker executes plans in order (see `register_full_blocks`).
A hit must hold in every cache group (vLLM intersects the groups' hits): each KV table registers its blocks under
its own key, and a hit of n blocks needs a table reading the whole context to cache all n, a windowed table only
those its window reads after them (vLLM's sliding-window manager); a block a window freed before it was full is
never offered. A model with state layers also needs a snapshot of its state after block n (state_snapshots.py).
With the radix tree a hit may end inside a block: the cached block's first tokens are copied into a fresh one
(copy-on-write) once the step writing them has reported, and a request's partly filled last block is kept when it
ends (`keep_partial`).
Usage: `hit = cache.lookup(request)`, `cache.take(request, hit, copies)` at admission;
`cache.register_full_blocks(request)` whenever a request's computed or known tokens grow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import BlockCopy
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.offload_tier import OffloadTier
from rapid_llm.scheduler_proc.request_state import FREED_BLOCK, RequestState
from rapid_llm.scheduler_proc.state_snapshots import StateSnapshots
from rapid_llm.utils.block_hash import BlockHash


def table_key(block_hash: BlockHash, table: int) -> BlockHash:
    """A block's key in KV table `table`: the same tokens cache different layers' KV in each table."""
    return block_hash if table == 0 else block_hash + table.to_bytes(4, "little")


@dataclass
class CacheHit:
    """What a waiting request can start from: `num_blocks` full blocks in each KV table (`block_ids`, table 0's
    first; FREED_BLOCK where a windowed table need not hold one), then the next blocks from the offload tier's
    `tier_slots`, or maybe `partial` = (block, n): the first n tokens of the next block, copied from that block."""

    block_ids: list[int]
    num_blocks: int
    partial: tuple[int, int] | None = None
    tier_slots: list[int] = field(default_factory=list)

    def num_tokens(self, block_size: int) -> int:
        return (self.num_blocks + len(self.tier_slots)) * block_size + (self.partial[1] if self.partial else 0)

    def blocks_to_share(self) -> list[int]:
        """The cached blocks the admission references (the partial source only while it is copied)."""
        shared = [block for block in self.block_ids if block != FREED_BLOCK]
        return shared + [self.partial[0]] if self.partial else shared


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
        self.tier: OffloadTier | None = None  # the offload tier, if there is one (scheduler_state.py)
        self.queries = 0  # tokens looked up at admissions, since start
        self.hits = 0  # of those, tokens found cached on the device
        self.tier_hits = 0  # and tokens loaded from the offload tier

    def lookup(self, request: RequestState) -> CacheHit:
        """The cached blocks a waiting request can start from (not taken yet)."""
        if not self.serves(request):
            return CacheHit([], 0)
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
        tier_slots = self.tier.lookup(hashes[num_hits:]) if self.tier is not None else []
        if tier_slots:
            return CacheHit(hits, num_hits, tier_slots=tier_slots)
        return CacheHit(hits, num_hits, self._partial_hit(request, hashes, num_hits))

    def _partial_hit(self, request: RequestState, hashes: list[BlockHash], num_blocks: int) -> tuple[int, int] | None:
        """The cached block sharing the most of the request's next tokens after its full-block hits (radix only)."""
        if not self._blocks.index.partial_hits:
            return None
        start = num_blocks * self.block_size
        end = min(start + self.block_size, request.num_tokens - 1)
        if end <= start:
            return None
        return self._blocks.match_partial(hashes[num_blocks - 1] if num_blocks else None,
                                          request.token_slice(start, end), request.extra_cache_key)

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

    def take(self, request: RequestState, hit: CacheHit, copies: list[BlockCopy]) -> list[int]:
        """Start `request` from `hit` (ref counts +1) and count the admission's lookup; returns the blocks its first
        chunk starts from. A partial hit's block is copied into a fresh block (appended to `copies`), which the
        request then owns and writes its own tokens into."""
        num_blocks = hit.num_blocks
        num_cached = hit.num_tokens(self.block_size)
        shared = hit.blocks_to_share()
        self._blocks.share(shared)
        self._blocks.count_hits(shared)
        blocks = list(hit.block_ids)
        if hit.tier_slots:
            loaded = self._blocks.allocate(len(hit.tier_slots))
            self.tier.load(hit.tier_slots, loaded)
            blocks += loaded
        if hit.partial is not None:
            source = hit.partial[0]
            blocks += self._blocks.allocate(1)
            copies.append(BlockCopy(source, blocks[-1]))
            # The copy is planned: it runs before anything this plan or a later one writes into the source.
            self._blocks.free([source])
        request.clear_blocks()
        request.extend_blocks(blocks)
        request.num_freed = [self.first_read(table, num_blocks) for table in range(len(self.windows))]
        request.num_registered_blocks = num_blocks
        if hit.tier_slots:
            # Loaded before this step's forward, so as cacheable as blocks this step computes.
            request.num_registered_blocks += len(hit.tier_slots)
            self.cache_blocks(request, 0, blocks, num_blocks, request.num_registered_blocks)
        request.num_computed_tokens = num_cached
        if self.snapshots is not None and num_blocks:
            request.state_load = self.snapshots.snapshot_of(request.block_hashes(num_blocks)[num_blocks - 1])
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        if self.enabled:
            # Counted per admission, like vLLM: a request resumed after preemption looks up again.
            self.queries += request.num_tokens
            self.hits += num_cached - len(hit.tier_slots) * self.block_size
            self.tier_hits += len(hit.tier_slots) * self.block_size
        return blocks

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
        for table, (block_ids, num_freed) in enumerate(zip(request.block_tables, request.num_freed)):
            # A block a sliding window freed before its tokens were all known is not offered (its id is gone).
            self.cache_blocks(request, table, block_ids, max(request.num_registered_blocks, num_freed), num_full)
        request.num_registered_blocks = num_full

    def cache_blocks(self, request: RequestState, table: int, block_ids: list[int], first: int, end: int) -> None:
        """Register the request's full blocks [first, end) of KV table `table`, held in `block_ids`."""
        hashes = request.block_hashes(end)
        for index in range(first, end):
            start = index * self.block_size
            parent = table_key(hashes[index - 1], table) if index else None
            self._blocks.cache_block(block_ids[index], table_key(hashes[index], table), parent,
                                     request.token_slice(start, start + self.block_size), start,
                                     request.extra_cache_key)

    def keep_partial(self, request: RequestState) -> None:
        """Before the request's blocks go back: offer its partly filled last block to a cache that keeps those (its
        computed, known tokens; the radix tree), so that a request repeating them hits to the token."""
        if not self.enabled or not self._blocks.index.partial_hits or request.beam is not None:
            return
        num_valid = min(request.num_computed_tokens, request.num_known_tokens)
        num_full, num_tail = divmod(num_valid, self.block_size)
        if num_tail == 0 or len(request.block_ids) <= num_full:
            return
        start = num_full * self.block_size
        parent = request.block_hashes(num_full)[num_full - 1] if num_full else None
        self._blocks.cache_partial(request.block_ids[num_full], parent, request.token_slice(start, num_valid), start,
                                   request.extra_cache_key)

    def planning(self, step_id: int) -> None:
        """Plan `step_id` is being made: what is cached from now on has its KV written by it at the latest."""
        self._blocks.index.stamp(step_id)

    def reported(self, step_id: int) -> None:
        """Step `step_id`'s result has been taken (its failures too): the blocks it wrote may be copied."""
        self._blocks.index.settle(step_id)
