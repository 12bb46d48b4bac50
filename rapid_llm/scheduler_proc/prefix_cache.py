"""PrefixCache: the scheduler's side of automatic prefix caching -- lookups at admission, registering full
blocks, and the hit counters -- over the BlockManager's hash table.

Key design choice: a block is offered to the cache only once its tokens are all real (no placeholder) and
its KV is scheduled, so a hit never depends on a token the worker has not been told; readers of a block
still being written are safe because the worker executes plans in order (see `register_full_blocks`).
A hit must hold in every cache group (vLLM intersects the groups' hits); a model with recurrent layers (a state
group, which keeps nothing per block) therefore never hits, and its blocks are not registered.
Usage: `hits = cache.lookup(request)`, `cache.take(request, hits)` at admission;
`cache.register_full_blocks(request)` whenever a request's computed or known tokens grow.
"""

from __future__ import annotations

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.request_state import RequestState


class PrefixCache:
    def __init__(self, blocks: BlockManager, config: SchedulerConfig) -> None:
        self._blocks = blocks
        self.enabled = config.enable_prefix_caching
        # A state group's hits are always empty, so the intersection over groups is too.
        self.hits_possible = not config.recurrent_state
        self.block_size = config.block_size
        self.queries = 0  # tokens looked up at admissions, since start
        self.hits = 0  # of those, tokens found cached

    def lookup(self, request: RequestState) -> list[int]:
        """The cached blocks a waiting request can start from (not taken yet)."""
        # Cached tokens are never computed, so they would have no prompt logprobs (vLLM skips the cache too)
        # and no hidden states for mean pooling.
        if (not self.enabled or not self.hits_possible or request.params.prompt_logprobs is not None
                or request.params.pooling == "mean"):
            return []
        # At least one token is always computed, so that the step has logits to sample from; a
        # block that token falls in is written, and a block being written is never shared.
        max_blocks = (request.num_tokens - 1) // self.block_size
        return self._blocks.lookup(request.block_hashes(max_blocks)[:max_blocks])

    def take(self, request: RequestState, hits: list[int]) -> None:
        """Start `request` from `hits` (ref counts +1) and count the admission's lookup."""
        num_cached = len(hits) * self.block_size
        self._blocks.share(hits)
        request.block_ids = list(hits)
        request.num_registered_blocks = len(hits)
        request.num_computed_tokens = num_cached
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
        # A block a sliding window freed before its tokens were all known is not offered (its id is gone).
        for index in range(max(request.num_registered_blocks, request.num_freed_blocks), num_full):
            self._blocks.cache_block(request.block_ids[index], hashes[index])
        request.num_registered_blocks = num_full
