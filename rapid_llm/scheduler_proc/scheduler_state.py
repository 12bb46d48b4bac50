"""The scheduler's shared bookkeeping: requests and queues, KV blocks and slots, steps in flight, unsent outputs,
and the moves that end or restart a request (finish, fail, preempt).

Key design choice: a request's resources go back the moment it ends or is preempted (blocks to the pool, full
ones staying in the prefix cache; slots to the next plan's released list), because the worker runs steps in
order, so no later step reads them; a result that still names the request is recognised as stale by its epoch.
Which slots and blocks a request holds, and how they go back, is its step policy's (`slots_of`, `blocks_of`,
`release`), which uses `block_manager` and `release_slots` here. Planning (`scheduler.py`) and taking results
(`step_results.py`) are layers on this state; callers use the one class on top, `Scheduler`.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import (DetokenizeRequest, KVLease, KVLoad, KVTransferEnded, Rollback, SchedulerStats,
                                    TokenBatch)
from rapid_llm.scheduler_proc.block_manager import BlockManager, make_index
from rapid_llm.scheduler_proc.offload_tier import OffloadTier
from rapid_llm.scheduler_proc.plan_record import StepRecord
from rapid_llm.scheduler_proc.prefix_cache import PrefixCache
from rapid_llm.scheduler_proc.remote_kv import RemoteKV
from rapid_llm.scheduler_proc.request_state import RequestState, RequestStatus
from rapid_llm.scheduler_proc.speculation import Speculation
from rapid_llm.scheduler_proc.step_cost import StepCostModel

logger = logging.getLogger(__name__)


class SchedulerState:
    """What planning and result taking share; no sockets, no tensors."""

    def __init__(self, config: SchedulerConfig) -> None:
        if config.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be set from the worker's cache size, got {config.num_kv_blocks}")
        capacity = config.num_kv_blocks * config.block_size
        # A lone request could outgrow the whole cache and then never be admitted again. In a windowed KV table it
        # holds at most the window behind its chunk, the chunk, and a partial block at each end.
        needed = sum(config.max_model_len if window is None else min(
            config.max_model_len, window + config.max_num_batched_tokens + 2 * config.block_size)
            for window in config.kv_windows)
        if capacity < needed:
            what = (f"max_model_len ({config.max_model_len})" if needed == config.max_model_len else
                    f"what one request's attention windows and chunk take over {len(config.kv_windows)} KV "
                    f"table(s) ({needed})")
            raise ValueError(f"the KV cache holds {capacity} tokens, fewer than {what}; "
                             "lower --max-model-len or give the KV cache more memory")
        if config.kv_transfer is not None and (len(config.kv_windows) > 1 or config.recurrent_state):
            raise ValueError("--kv-transfer-config with a model of sliding-window and full layers or recurrent state: "
                             "the built-in transfer moves one KV table's blocks, not several tables or states")
        self.config = config
        self._blocks = BlockManager(config.num_kv_blocks, config.block_size, make_index(
            config.cache_policy(), config.num_kv_blocks, config.eviction_policy))
        self._prefix_cache = PrefixCache(self._blocks, config)
        self.tier = self._offload_tier(config)
        self._free_slots = list(range(config.max_num_seqs))  # a sorted list is already a heap
        self._released_slots: list[int] = []
        self._requests: dict[str, RequestState] = {}
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []  # in order of admission
        self._inflight: deque[StepRecord] = deque()
        self._next_step_id = 0
        self._num_preemptions = 0
        self._num_steps_done = 0
        self._detokenize_requests: list[DetokenizeRequest] = []
        self._updated: dict[RequestState, None] = {}  # ordered set of requests with unsent output
        self._speculation = None if config.speculative is None else Speculation(config.speculative)
        self._rollbacks: dict[int, Rollback] = {}  # slot -> cut the next plan tells the worker
        self._step_cost = StepCostModel()
        self._itl_target_s = None if config.itl_target_ms is None else config.itl_target_ms / 1000
        self.remote_kv = (None if config.kv_transfer is None else
                          RemoteKV(config.kv_transfer, self._blocks, self._prefix_cache, config.block_size,
                                   config.num_worker_ranks, reserve_blocks=min(
                                       config.num_kv_blocks // 2,
                                       self._blocks.blocks_for_tokens(config.max_num_batched_tokens))))

    def _offload_tier(self, config: SchedulerConfig) -> OffloadTier | None:
        """The offload tier the worker keeps, hooked to the prefix cache's evictions."""
        if not config.kv_offload_slots or not config.enable_prefix_caching:
            return None
        blocker = ("its sliding-window and full layers keep several KV tables" if len(config.kv_windows) > 1 else
                   "its state layers need state snapshots at hits" if config.recurrent_state else
                   "a KV transfer writes blocks outside the steps" if config.kv_transfer is not None else None)
        if blocker is not None:
            raise ValueError(f"--kv-offload-size is not available here: {blocker}, which the offload tier does not "
                             "handle yet")
        tier = OffloadTier(config.kv_offload_slots, config.block_size)
        self._blocks.index.on_evict = tier.save
        self._prefix_cache.tier = tier
        return tier

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request is unfinished."""
        if self.has_unfinished_requests():
            return False
        self._blocks.reset_cache()
        if self.tier is not None:
            self.tier.reset()
        if self._prefix_cache.snapshots is not None:
            self._prefix_cache.snapshots.reset()
        return True

    # ---- ending and restarting requests ------------------------------------------------------

    def _preempt(self, request: RequestState) -> None:
        self._num_preemptions += 1
        logger.warning("KV cache full: preempted request %s (it will be recomputed; %d preemptions so far)",
                       request.request_id, self._num_preemptions)
        self._requeue(request)

    def _requeue(self, request: RequestState) -> None:
        """Back to the front of the queue, to be recomputed from scratch."""
        self._running.remove(request)
        request.policy.release(self, request)
        request.reset_for_recompute()
        self._waiting.appendleft(request)

    def _fail(self, request: RequestState, error: str) -> None:
        """End a request the worker could not serve: the KV of its blocks may never have been written.

        Requests planned before the failure was known may already read those blocks (prefix-cache
        hits), and the KV they wrote from them is wrong too; all of them are recomputed, and every
        block involved leaves the prefix cache. This may recompute more than needed; failures are rare.
        """
        suspect = set(request.policy.blocks_of(request))
        request.error, request.error_kind = error, "internal"
        self._finish(request, "abort", None)
        readers = [other for other in self._running if suspect.intersection(other.policy.blocks_of(other))]
        while readers:
            for reader in readers:
                suspect.update(reader.policy.blocks_of(reader))
                self._requeue(reader)
            readers = [other for other in self._running if suspect.intersection(other.policy.blocks_of(other))]
        self._blocks.uncache(suspect)

    def _finish(self, request: RequestState, finish_reason: str, stop_reason: int | None) -> None:
        if request.status is RequestStatus.WAITING:
            self._waiting.remove(request)
        elif request.status is RequestStatus.RUNNING:
            self._running.remove(request)
        # Set before the release: a prefill instance's policy leases the prompt's blocks when it ended by length.
        request.status = RequestStatus.FINISHED
        request.finish_reason = finish_reason
        request.stop_reason = stop_reason
        request.policy.release(self, request)
        del self._requests[request.request_id]
        self._updated[request] = None

    # ---- resources, for the step policies' `release` and `free_behind_window` -------------------

    @property
    def block_manager(self) -> BlockManager:
        return self._blocks

    def free_blocks_of(self, request: RequestState) -> None:
        """Return the request's blocks, its partly filled last one offered to the prefix cache first."""
        self._prefix_cache.keep_partial(request)
        self._blocks.free(reversed(request.held_block_ids()))
        request.clear_blocks()

    def release_slots(self, slots: list[int]) -> None:
        """Slots free for the next admission; the next plan tells the worker, and no cut is owed for them."""
        for slot in slots:
            heapq.heappush(self._free_slots, slot)
            self._released_slots.append(slot)
            self._rollbacks.pop(slot, None)

    # ---- prefill/decode disaggregation (remote_kv.py) -----------------------------------------

    def exchange_kv(self, events: list[KVTransferEnded] = ()) -> list[KVLease | KVLoad]:
        """Take the transfer agent's events, queue the requests whose load ended, advance staged loads, and
        return the commands for the agent (none without --kv-transfer-config)."""
        if self.remote_kv is None:
            return []
        loaded, others = self.remote_kv.on_events(list(events))
        # Loaded requests first: their blocks are pinned until they are admitted.
        for request in reversed(loaded):
            request.status = RequestStatus.WAITING
            self._waiting.appendleft(request)
        for request in others + self.remote_kv.advance(self._next_step_id, self.oldest_inflight_step_id):
            request.status = RequestStatus.WAITING
            self._waiting.append(request)
        commands, self.remote_kv.commands = self.remote_kv.commands, []
        return commands

    # ---- outputs and introspection -----------------------------------------------------------

    def take_outputs(self) -> TokenBatch | None:
        if not self._detokenize_requests and not self._updated:
            return None
        batch = TokenBatch(
            new_requests=self._detokenize_requests,
            updates=[request.take_update() for request in self._updated],
        )
        self._detokenize_requests = []
        self._updated = {}
        return batch

    def stats(self) -> SchedulerStats:
        counters = self._speculation.counters if self._speculation is not None else None
        remote = self.remote_kv
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting) + (remote.num_loading_requests if remote else 0),
            kv_blocks_used=self._blocks.num_used_blocks,
            kv_blocks_total=self._blocks.num_blocks,
            num_preemptions=self._num_preemptions,
            prefix_cache_queries=self._prefix_cache.queries,
            prefix_cache_hits=self._prefix_cache.hits,
            external_prefix_cache_hits=self._prefix_cache.tier_hits,
            kv_offload_blocks_saved=self.tier.num_saved if self.tier else 0,
            kv_offload_blocks_loaded=self.tier.num_loaded if self.tier else 0,
            num_steps=self._num_steps_done,
            spec_decode_num_drafts=counters.num_drafts if counters else 0,
            spec_decode_num_draft_tokens=counters.num_draft_tokens if counters else 0,
            spec_decode_num_accepted_tokens=counters.num_accepted_tokens if counters else 0,
            spec_decode_num_accepted_tokens_per_pos=list(counters.accepted_per_position) if counters else [],
            spec_decode_num_disables=self._speculation.adaptive.num_disables if counters else 0,
            spec_decode_num_gate_closes=self._speculation.gate.num_closes if counters else 0,
            kv_transfer_loads=remote.num_loads if remote else 0,
            kv_transfer_failures=remote.num_failures if remote else 0,
            kv_transfer_bytes=remote.num_bytes if remote else 0,
            kv_transfer_seconds=remote.seconds if remote else 0.0,
            kv_transfer_expired_leases=remote.num_expired if remote else 0,
        )

    @property
    def num_inflight_steps(self) -> int:
        return len(self._inflight)

    @property
    def oldest_inflight_step_id(self) -> int | None:
        return self._inflight[0].step_id if self._inflight else None

    def has_unfinished_requests(self) -> bool:
        """Requests waiting, loading or running, or blocks leased to a decode instance."""
        return bool(self._waiting or self._running or (self.remote_kv is not None and self.remote_kv.busy()))
