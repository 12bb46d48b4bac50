"""The scheduling policy: one token budget per step, shared by decodes, prefill chunks and admissions.

Pure bookkeeping: no sockets, no tensors. Each running request's step is what its step policy asks for
(`step_policy.py`: plain, speculative, beam). A plan may be made before the previous step's tokens are known
(async scheduling), so every plan records which request, in which preemption epoch, held each sampling slot;
results are mapped through that record and land on the right request or are dropped. With prefix caching, a
request is admitted with the longest run of cached full blocks that matches its tokens and computes only the
rest. A beam-search request (`beam_group.py`) is one entry of the running list whose W beams share blocks;
like a speculating request (`speculation.py`: drafts from the n-gram proposer here, or from the worker's
result), its next step waits for its previous result while other requests keep overlapping. A cost model
fitted to measured step times (`step_cost.py`) shapes prompt chunks: a long step where a prompt ends takes no
other prompt, and with an ITL target a step carrying decodes takes only the prompt tokens that fit it.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import (
    BlockCopy,
    DetokenizeRequest,
    GenerateRequest,
    LastToken,
    NewRequest,
    Rollback,
    ScheduledChunk,
    SchedulerStats,
    StepPlan,
    StepResult,
    TokenBatch,
    TokenLogprobs,
)
from rapid_llm.scheduler_proc.admission import DuplicateRequestId, check_admissible
from rapid_llm.scheduler_proc.beam_group import BeamGroup
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.prefix_cache import PrefixCache
from rapid_llm.scheduler_proc.request_state import RequestState, RequestStatus
from rapid_llm.scheduler_proc.speculation import Speculation
from rapid_llm.scheduler_proc.step_cost import PrefillAllowance, StepCostModel, step_features
from rapid_llm.scheduler_proc.step_policy import BEAM, PLAIN, SPECULATIVE, StepAsk, StepPolicy
from rapid_llm.spec_decode.eligibility import speculation_blocker

logger = logging.getLogger(__name__)


@dataclass
class _StepRecord:
    step_id: int
    samplers: dict[int, tuple[RequestState, int]]  # slot -> (request, its epoch) when planned
    # Every chunk decodes (1 + its drafts tokens, then samples): the speed gate measures it (False without
    # speculation, where nobody reads it).
    decode_only: bool
    features: tuple[int, int]  # (tokens, attention pairs): what the step cost model learns the time of


@dataclass
class _PlanDraft:
    budget: int
    prefill: PrefillAllowance | None = None  # None: prompt chunks are cut by the token budget alone
    new_requests: list[NewRequest] = field(default_factory=list)
    chunks: list[ScheduledChunk] = field(default_factory=list)
    samplers: dict[int, tuple[RequestState, int]] = field(default_factory=dict)
    proposals: dict[RequestState, list[int]] = field(default_factory=dict)  # the n-gram proposer's drafts
    last_tokens: list[LastToken] = field(default_factory=list)
    block_copies: list[BlockCopy] = field(default_factory=list)


class Scheduler:
    """Decides each step's batch; the process loop owns the sockets and calls in."""

    def __init__(self, config: SchedulerConfig) -> None:
        if config.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be set from the worker's cache size, got {config.num_kv_blocks}")
        capacity = config.num_kv_blocks * config.block_size
        # A lone request could outgrow the whole cache and then never be admitted again. With a window in every
        # layer it holds at most the window behind its chunk, the chunk, and a partial block at each end.
        needed = config.max_model_len if config.sliding_window is None else min(
            config.max_model_len, config.sliding_window + config.max_num_batched_tokens + 2 * config.block_size)
        if capacity < needed:
            what = (f"max_model_len ({config.max_model_len})" if needed == config.max_model_len else
                    f"one request's attention window and chunk ({needed})")
            raise ValueError(f"the KV cache holds {capacity} tokens, fewer than {what}; "
                             "lower --max-model-len or give the KV cache more memory")
        self.config = config
        self._blocks = BlockManager(config.num_kv_blocks, config.block_size)
        self._prefix_cache = PrefixCache(self._blocks, config)
        self._free_slots = list(range(config.max_num_seqs))  # a sorted list is already a heap
        self._released_slots: list[int] = []
        self._requests: dict[str, RequestState] = {}
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []  # in order of admission
        self._inflight: deque[_StepRecord] = deque()
        self._next_step_id = 0
        self._num_preemptions = 0
        self._num_steps_done = 0
        self._detokenize_requests: list[DetokenizeRequest] = []
        self._updated: dict[RequestState, None] = {}  # ordered set of requests with unsent output
        self._speculation = None if config.speculative is None else Speculation(config.speculative)
        self._rollbacks: dict[int, Rollback] = {}  # slot -> cut the next plan tells the worker
        self._step_cost = StepCostModel()
        self._itl_target_s = None if config.itl_target_ms is None else config.itl_target_ms / 1000

    # ---- requests in -------------------------------------------------------------------------

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a new request; `RequestRejected` if it is refused, `DuplicateRequestId` if its id is in use."""
        if request.request_id in self._requests:
            raise DuplicateRequestId(f"request id {request.request_id!r} is already in use")
        check_admissible(request, self.config, len(self._waiting))
        state = RequestState(request, self.config.max_model_len, self.config.block_size)
        if request.params.use_beam_search:
            max_new_tokens = min(state.max_tokens, self.config.max_model_len - state.num_prompt_tokens)
            state.beam = BeamGroup(request.params, max_new_tokens, self.config.eos_token_ids)
        if self._speculation is not None:
            blocker = speculation_blocker(request.params)
            state.speculates = blocker is None
            if blocker is not None:
                logger.debug("request %s decodes without speculation: %s", request.request_id, blocker)
        state.policy = self.policy_for(state)
        self._requests[request.request_id] = state
        self._waiting.append(state)
        self._detokenize_requests.append(
            DetokenizeRequest(
                request_id=request.request_id,
                prompt_token_ids=request.prompt_token_ids,
                stop=request.params.stop,
                skip_special_tokens=request.params.skip_special_tokens,
                min_tokens=request.params.min_tokens,
                include_stop_str_in_output=request.params.include_stop_str_in_output,
            )
        )

    def abort_request(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, "abort", None)

    # ---- planning ----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        draft = _PlanDraft(budget=self.config.max_num_batched_tokens, prefill=self._prefill_allowance())
        preempted = self._schedule_running(draft)
        # After a preemption, admitting (even the victim, with a small chunk) would only thrash.
        if not preempted:
            self._schedule_waiting(draft)
        if not draft.chunks:
            return None
        plan = StepPlan(
            step_id=self._next_step_id,
            rollbacks=list(self._rollbacks.values()),
            released_slots=self._released_slots,
            new_requests=draft.new_requests,
            scheduled=draft.chunks,
            last_tokens=draft.last_tokens,
            block_copies=draft.block_copies,
        )
        self._released_slots = []
        self._rollbacks = {}
        decode_only = self._speculation is not None and not draft.new_requests and all(
            chunk.num_new_tokens == 1 + len(chunk.draft_token_ids) and chunk.slot in draft.samplers
            for chunk in draft.chunks)
        features = step_features((chunk.num_computed_tokens, chunk.num_new_tokens) for chunk in draft.chunks)
        self._inflight.append(_StepRecord(self._next_step_id, draft.samplers, decode_only, features))
        self._next_step_id += 1
        return plan

    def _prefill_allowance(self) -> PrefillAllowance | None:
        """The cost model's cut on this step's prompt chunks, when a prompt waits or is being prefilled."""
        if not self._waiting and not any(r.num_tokens - r.num_computed_tokens > 1 for r in self._running):
            return None  # a decode-only step: nothing to cut
        # Only the ITL target weighs the step's decodes.
        decodes = [] if self._itl_target_s is None else [
            (r.num_computed_tokens, 1) for r in self._running if r.num_tokens - r.num_computed_tokens <= 1]
        return PrefillAllowance.start(self._step_cost, self._itl_target_s, decodes)

    def _schedule_running(self, draft: _PlanDraft) -> bool:
        """Give each running request what its step policy asks for; returns whether anything was preempted."""
        preempted = False
        self._free_behind_windows()
        draft.proposals = self._speculation.propose(self._running) if self._speculation is not None else {}
        index = 0
        while index < len(self._running) and draft.budget > 0:
            request = self._running[index]
            ask = request.policy.ask(self, request, draft)
            if ask is None:
                index += 1
                continue
            while not self._blocks.can_allocate(ask.num_blocks):
                # The newest running request is always at or after `index`: not yet scheduled here.
                victim = self._running[-1]
                self._preempt(victim)
                preempted = True
                if victim is request:
                    return True
            request.policy.add(self, request, draft, ask)
            index += 1
        return preempted

    def _free_behind_windows(self) -> None:
        """With a window in every layer, return the blocks it has passed: a request's next chunk starts at its
        computed count and reads back at most the window; steps planned before run (and read) before this one."""
        window = self.config.sliding_window
        if window is None:
            return
        for request in self._running:
            if request.beam is None:
                self._blocks.free(request.release_blocks_before(request.num_computed_tokens - window))

    def policy_for(self, request: RequestState) -> StepPolicy:
        """The step policy a new request runs under (step_policy.py)."""
        if request.beam is not None:
            return BEAM
        return SPECULATIVE if request.speculates else PLAIN

    def chunk_ask(self, request: RequestState, num_new: int) -> StepAsk:
        """`num_new` tokens after the request's computed ones, with the blocks they need."""
        return StepAsk(num_new, self._num_new_blocks(request.num_computed_tokens, len(request.block_ids), num_new))

    def _schedule_waiting(self, draft: _PlanDraft) -> None:
        while self._waiting and draft.budget > 0 and len(self._running) < self.config.max_num_seqs:
            request = self._waiting[0]
            # A beam group reserves a slot per beam when it is admitted.
            num_slots = 1 if request.beam is None else request.beam.width
            if len(self._free_slots) < num_slots:
                return
            hits = self._prefix_cache.lookup(request)
            num_computed = len(hits) * self.config.block_size
            num_new = self.num_new_tokens(request, num_computed, draft)
            # Hits that nobody references sit in the free queue: sharing them leaves fewer to allocate.
            num_blocks = self._num_new_blocks(num_computed, len(hits), num_new) + self._blocks.num_unreferenced(hits)
            # FCFS: nobody overtakes a request that cannot be admitted yet.
            if num_new == 0 or not self._blocks.can_allocate(num_blocks):
                return
            self._waiting.popleft()
            self._prefix_cache.take(request, hits)
            request.mark_scheduled()
            request.status = RequestStatus.RUNNING
            request.slot = heapq.heappop(self._free_slots)
            if request.beam is not None:
                request.beam.slots = [request.slot] + [heapq.heappop(self._free_slots) for _ in range(num_slots - 1)]
            self._running.append(request)
            draft.new_requests.append(
                NewRequest(
                    request_id=request.request_id,
                    slot=request.slot,
                    token_ids=request.known_token_ids(),
                    num_prompt_tokens=request.num_prompt_tokens,
                    params=request.params if request.beam is None else request.beam.worker_params,
                )
            )
            self.add_chunk(draft, request, num_new, cached_block_ids=hits)

    def num_new_tokens(self, request: RequestState, num_computed: int, draft: _PlanDraft) -> int:
        """Tokens to compute for `request` this step; 0 when its next sample would pass a limit."""
        num_new = min(request.num_tokens - num_computed, draft.budget)
        if num_new > 1 and draft.prefill is not None:
            num_new = draft.prefill.cap(num_computed, num_new)
        reaches_end = num_computed + num_new == request.num_tokens
        if reaches_end and not request.can_sample():
            return 0
        return num_new

    def _num_new_blocks(self, num_computed: int, num_held: int, num_new: int) -> int:
        # The blocks held always cover exactly the computed tokens, so this is never negative.
        return self._blocks.blocks_for_tokens(num_computed + num_new) - num_held

    def add_chunk(self, draft: _PlanDraft, request: RequestState, num_new: int,
                   cached_block_ids: list[int] | None = None, drafts: list[int] | None = None) -> None:
        if request.slot is None:
            raise RuntimeError(f"request {request.request_id} is scheduled without a slot")
        num_blocks = self._num_new_blocks(request.num_computed_tokens, len(request.block_ids), num_new)
        new_block_ids = self._blocks.allocate(num_blocks)
        request.block_ids.extend(new_block_ids)
        if num_new > 1 and not drafts and draft.prefill is not None:
            draft.prefill.count(request.num_computed_tokens, num_new,
                                ends_prompt=request.num_computed_tokens + num_new == request.num_tokens)
        draft.chunks.append(ScheduledChunk(request.slot, request.num_computed_tokens, num_new, new_block_ids,
                                           cached_block_ids or [], drafts or [], self.drafts_after(request)))
        request.draft_token_ids = drafts or []
        request.num_computed_tokens += num_new
        draft.budget -= num_new
        self._prefix_cache.register_full_blocks(request)
        if request.num_computed_tokens == request.num_tokens:
            # The worker samples here; the next plan may already decode that token from its pool.
            request.num_placeholders += 1
            draft.samplers[request.slot] = (request, request.epoch)
            if request.beam is not None:
                request.beam.in_flight = True

    def drafts_after(self, request: RequestState) -> bool:
        """Whether the request drafts after its next step (it speculates and the speed gate is open)."""
        return request.speculates and self._speculation.gate.open

    def add_beam_step(self, draft: _PlanDraft, request: RequestState) -> None:
        step = request.beam.plan_step(request.request_id, request.prompt_token_ids, self._blocks, self.config.block_size)
        draft.new_requests.extend(step.new_requests)
        draft.chunks.extend(step.chunks)
        draft.last_tokens.extend(step.last_tokens)
        draft.block_copies.extend(step.block_copies)
        draft.budget -= len(step.chunks)
        for chunk in step.chunks:
            draft.samplers[chunk.slot] = (request, request.epoch)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; refused (False) while any request is unfinished."""
        if self.has_unfinished_requests():
            return False
        self._blocks.reset_cache()
        return True

    def _preempt(self, request: RequestState) -> None:
        self._num_preemptions += 1
        logger.warning("KV cache full: preempted request %s (it will be recomputed; %d preemptions so far)",
                       request.request_id, self._num_preemptions)
        self._requeue(request)

    def _requeue(self, request: RequestState) -> None:
        """Back to the front of the queue, to be recomputed from scratch."""
        self._running.remove(request)
        self._release_resources(request)
        request.reset_for_recompute()
        if request.beam is not None:
            # Nothing of a beam search was sent yet: it restarts from its prompt (usually cached blocks).
            request.beam.reset()
        self._waiting.appendleft(request)

    # ---- results in, outputs out -------------------------------------------------------------

    def process_result(self, result: StepResult) -> None:
        record = self._pop_record(result)
        self._num_steps_done += 1
        if result.step_seconds > 0:
            self._step_cost.observe(record.features, result.step_seconds)
        # Failures first: recomputing the requests that read a failed request's blocks makes this
        # step's tokens of theirs stale (their epoch changes), so they are dropped below.
        for failure in result.failures:
            request = self._requests.get(failure.request_id)
            # A failure reported again for a slot already released, or a request preempted since
            # (it fails again, and is reported again, if it comes back) ends nothing.
            if request is not None and failure.slot in self._slots_of(request):
                self._fail(request, failure.error)
        # Before the tokens: the chunk that ends a prompt also samples its first token, which carries them out.
        for chunk in result.prompt_logprobs:
            request = self._requests.get(chunk.request_id)
            if request is not None and not request.is_finished:
                request.add_prompt_logprobs(chunk.start, chunk.entries)
        for pooled in result.pooled:
            request = self._requests.get(pooled.request_id)
            if request is not None and not request.is_finished:
                request.unsent_embedding = pooled.values
        beam_rounds: dict[RequestState, dict[int, TokenLogprobs | None]] = {}
        for index, (slot, token_id) in enumerate(zip(result.slots, result.token_ids)):
            request, epoch = record.samplers[slot]
            # Finished, aborted or preempted since this step was planned: the token is stale.
            if request.is_finished or request.epoch != epoch:
                continue
            if request.beam is not None:
                beam_rounds.setdefault(request, {})[slot] = result.logprobs[index] if result.logprobs else None
                continue
            if request.draft_token_ids and self._speculation is not None:
                if not result.num_accepted:
                    raise ValueError(f"step {result.step_id}: slot {slot} verified drafts, but no num_accepted "
                                     "came back")
                self._add_tokens(request, self._speculation.verified(request, result.num_accepted[index], token_id,
                                                                     self._blocks), None)
                if not request.is_finished:
                    self._rollbacks[slot] = Speculation.rollback(request)
            else:
                self._add_tokens(request, [token_id], result.logprobs[index] if result.logprobs else None)
            if result.draft_token_ids and self._speculation is not None and not request.is_finished:
                self._speculation.received(request, result.draft_token_ids[index])
        for request, by_slot in beam_rounds.items():
            self._advance_beams(request, by_slot)
        if self._speculation is not None:
            self._speculation.gate.step_done(record.decode_only, len(self._running),
                                             len(result.slots) + sum(result.num_accepted))

    def _add_tokens(self, request: RequestState, token_ids: list[int], logprobs: TokenLogprobs | None) -> None:
        """Append sampled tokens (several after verified drafts) until one finishes the request."""
        for token_id in token_ids:
            request.add_sampled_token(token_id, logprobs)
            self._prefix_cache.register_full_blocks(request)
            self._updated[request] = None
            finish = request.finish_reason_for_last_token(self.config.eos_token_ids)
            if finish is not None:
                self._finish(request, *finish)
                return

    def _advance_beams(self, request: RequestState, by_slot: dict[int, TokenLogprobs | None]) -> None:
        """One round of a beam group's results: rank, fork the next beams, or finish with the best."""
        group = request.beam
        if group is None:
            raise RuntimeError(f"request {request.request_id} is not a beam search")
        if not group.started:
            # The prompt's last chunk sampled: its slot and blocks become the root beam.
            request.num_placeholders = 0
            if request.first_token_at is None:
                request.first_token_at = time.monotonic()
            group.start(request.slot, request.block_ids, request.num_computed_tokens)
            request.slot, request.block_ids = None, []
        self._released_slots.extend(group.advance_round(request.request_id, by_slot, self._blocks,
                                                        self.config.block_size))
        if group.search.done:
            request.beam_outputs = group.best_sequences()
            best = request.beam_outputs[0]
            self._finish(request, best.finish_reason, best.stop_reason)

    def _pop_record(self, result: StepResult) -> _StepRecord:
        if not self._inflight:
            raise ValueError(f"got a result for step {result.step_id} but no step is in flight")
        record = self._inflight[0]
        if result.step_id != record.step_id:
            raise ValueError(f"got a result for step {result.step_id}, expected step {record.step_id}")
        num_slots = len(result.slots)
        if (len(result.token_ids) != num_slots or (result.logprobs and len(result.logprobs) != num_slots)
                or (result.num_accepted and len(result.num_accepted) != num_slots)):
            raise ValueError(f"step {result.step_id}: slots, token_ids, logprobs and num_accepted differ in length")
        failed = {failure.slot for failure in result.failures}
        planned = sorted(slot for slot in record.samplers if slot not in failed)
        if sorted(result.slots) != planned:
            raise ValueError(f"step {result.step_id}: sampled slots {sorted(result.slots)}, planned {planned}")
        return self._inflight.popleft()

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

    def _fail(self, request: RequestState, error: str) -> None:
        """End a request the worker could not serve: the KV of its blocks may never have been written.

        Requests planned before the failure was known may already read those blocks (prefix-cache
        hits), and the KV they wrote from them is wrong too; all of them are recomputed, and every
        block involved leaves the prefix cache. This may recompute more than needed; failures are rare.
        """
        suspect = set(self._blocks_of(request))
        request.error, request.error_kind = error, "internal"
        self._finish(request, "abort", None)
        readers = [other for other in self._running if suspect.intersection(self._blocks_of(other))]
        while readers:
            for reader in readers:
                suspect.update(self._blocks_of(reader))
                self._requeue(reader)
            readers = [other for other in self._running if suspect.intersection(self._blocks_of(other))]
        self._blocks.uncache(suspect)

    def _finish(self, request: RequestState, finish_reason: str, stop_reason: int | None) -> None:
        if request.status is RequestStatus.WAITING:
            self._waiting.remove(request)
        else:
            self._running.remove(request)
        self._release_resources(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = finish_reason
        request.stop_reason = stop_reason
        del self._requests[request.request_id]
        self._updated[request] = None

    def _release_resources(self, request: RequestState) -> None:
        """Free blocks now (the worker runs steps in order, so no later step reads them) and the slot.

        Full blocks stay cached; freeing the last block first makes the prefix's tail evicted first.
        """
        self._blocks.free(reversed(request.held_block_ids()))
        request.block_ids = []
        for slot in self._slots_of(request):
            heapq.heappush(self._free_slots, slot)
            self._released_slots.append(slot)
            self._rollbacks.pop(slot, None)
        request.slot = None
        if request.beam is not None:
            request.beam.release(self._blocks)
            request.beam.slots = []

    @staticmethod
    def _slots_of(request: RequestState) -> list[int]:
        if request.beam is not None:
            return list(request.beam.slots)
        return [] if request.slot is None else [request.slot]

    @staticmethod
    def _blocks_of(request: RequestState) -> list[int]:
        if request.beam is not None and request.beam.started:
            return list(request.beam.block_ids())
        return request.held_block_ids()

    # ---- introspection -----------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        counters = self._speculation.counters if self._speculation is not None else None
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_blocks_used=self._blocks.num_used_blocks,
            kv_blocks_total=self._blocks.num_blocks,
            num_preemptions=self._num_preemptions,
            prefix_cache_queries=self._prefix_cache.queries,
            prefix_cache_hits=self._prefix_cache.hits,
            num_steps=self._num_steps_done,
            spec_decode_num_drafts=counters.num_drafts if counters else 0,
            spec_decode_num_draft_tokens=counters.num_draft_tokens if counters else 0,
            spec_decode_num_accepted_tokens=counters.num_accepted_tokens if counters else 0,
            spec_decode_num_accepted_tokens_per_pos=list(counters.accepted_per_position) if counters else [],
            spec_decode_num_disables=self._speculation.adaptive.num_disables if counters else 0,
            spec_decode_num_gate_closes=self._speculation.gate.num_closes if counters else 0,
        )

    @property
    def num_inflight_steps(self) -> int:
        return len(self._inflight)

    @property
    def oldest_inflight_step_id(self) -> int | None:
        return self._inflight[0].step_id if self._inflight else None

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)
