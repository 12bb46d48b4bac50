"""The scheduling policy: one token budget per step, shared by decodes, prefill chunks and admissions.

Pure bookkeeping: no sockets, no tensors. `Scheduler` is what the process loop calls: requests in
(`add_request`, `abort_request`), a plan per step (`schedule`, here), its result back (`process_result`,
`step_results.py`), outputs out (`take_outputs`, `scheduler_state.py`). Key design choice: what a request takes
to be admitted, each step it runs and the resources it holds are what its step policy says (`step_policy.py`:
plain, speculative, beam; chosen once, in `policy_for`), so no loop branches per request kind. A plan may be
made before the previous step's tokens are known (async scheduling): its record (`plan_record.py`) says which
request, in which epoch, held each sampling slot. With prefix caching, a request is admitted with its longest
run of cached full blocks and computes only the rest. A beam-search group (`beam_group.py`) or a speculating
request (`speculation.py`) waits for its previous result before its next step while others keep overlapping.
With pipeline stages every request does, and a plan takes at most an even share of the running requests: the
plans in flight are micro-batches of different requests, one per stage. A
cost model fitted to measured step times (`step_cost.py`) shapes prompt chunks: a long step where a prompt ends
takes no other prompt, and with an ITL target a step carrying decodes takes only the prompt tokens that fit it.
"""

from __future__ import annotations

import heapq
import logging

from rapid_llm.ipc.messages import DetokenizeRequest, GenerateRequest, NewRequest, ScheduledChunk, StepPlan
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.admission import DuplicateRequestId, check_admissible
from rapid_llm.scheduler_proc.beam_group import BeamGroup
from rapid_llm.scheduler_proc.plan_record import PlanDraft, StepRecord
from rapid_llm.scheduler_proc.request_state import RequestState, RequestStatus
from rapid_llm.scheduler_proc.step_cost import PrefillAllowance, step_features
from rapid_llm.scheduler_proc.step_policy import (BEAM, PLAIN, REMOTE_DECODE, SPECULATIVE, RemotePrefillPolicy, StepAsk,
                                                  StepPolicy)
from rapid_llm.scheduler_proc.step_results import StepResults
from rapid_llm.spec_decode.eligibility import speculation_blocker

logger = logging.getLogger(__name__)


class Scheduler(StepResults):
    """Decides each step's batch and takes its result; the process loop owns the sockets and calls in."""

    # ---- requests in -------------------------------------------------------------------------

    def add_request(self, request: GenerateRequest) -> None:
        """Queue a new request; `RequestRejected` if it is refused, `DuplicateRequestId` if its id is in use."""
        if request.request_id in self._requests:
            raise DuplicateRequestId(f"request id {request.request_id!r} is already in use")
        loading = self.remote_kv.num_loading_requests if self.remote_kv is not None else 0
        check_admissible(request, self.config, len(self._waiting) + loading)
        remote = request.params.kv_transfer_params
        state = RequestState(request, self.config.max_model_len, self.config.block_size, len(self.config.kv_windows))
        if request.params.use_beam_search:
            max_new_tokens = min(state.max_tokens, self.config.max_model_len - state.num_prompt_tokens)
            state.beam = BeamGroup(request.params, max_new_tokens, self.config.eos_token_ids)
        if self._speculation is not None:
            blocker = speculation_blocker(request.params)
            # A prefill instance's request samples one token: nothing to draft for.
            state.speculates = blocker is None and not (remote is not None and remote.do_remote_decode)
            if blocker is not None:
                logger.debug("request %s decodes without speculation: %s", request.request_id, blocker)
        state.policy = self.policy_for(state)
        self._requests[request.request_id] = state
        if remote is not None and remote.do_remote_prefill and self.remote_kv.stage(state, remote):
            state.status = RequestStatus.LOADING
        else:
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
        self._prefix_cache.planning(self._next_step_id)
        draft = PlanDraft(budget=self.config.max_num_batched_tokens, prefill=self._prefill_allowance())
        preempted = self._schedule_running(draft)
        # After a preemption, admitting (even the victim, with a small chunk) would only thrash.
        if not preempted:
            self._schedule_waiting(draft)
        tier_saves, tier_loads, tier_prefetch = self.tier.take_plan() if self.tier is not None else ([], [], [])
        if not draft.chunks and not tier_saves and not tier_loads and not tier_prefetch:
            return None
        plan = StepPlan(
            step_id=self._next_step_id,
            rollbacks=list(self._rollbacks.values()),
            released_slots=self._released_slots,
            new_requests=draft.new_requests,
            scheduled=draft.chunks,
            last_tokens=draft.last_tokens,
            block_copies=draft.block_copies,
            tier_saves=tier_saves,
            tier_loads=tier_loads,
            tier_prefetch=tier_prefetch,
        )
        self._released_slots = []
        self._rollbacks = {}
        decode_only = self._speculation is not None and not draft.new_requests and all(
            chunk.num_new_tokens == 1 + len(chunk.draft_token_ids) and chunk.slot in draft.samplers
            for chunk in draft.chunks)
        features = step_features((chunk.num_computed_tokens, chunk.num_new_tokens) for chunk in draft.chunks)
        self._inflight.append(StepRecord(self._next_step_id, draft.samplers, decode_only, features,
                                         draft.snapshot_saves))
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

    def _schedule_running(self, draft: PlanDraft) -> bool:
        """Give each running request what its step policy asks for; returns whether anything was preempted."""
        preempted = False
        self._free_behind_windows()
        draft.proposals = self._speculation.propose(self._running) if self._speculation is not None else {}
        micro_batch = self._micro_batch_size()
        index = scheduled = 0
        while index < len(self._running) and draft.budget > 0:
            request = self._running[index]
            # Pipeline stages: a request whose sampled token is not back sits in another micro-batch.
            ask = (None if micro_batch is not None and (request.num_placeholders or scheduled >= micro_batch)
                   else request.policy.ask(self, request, draft))
            if ask is None:
                index += 1
                continue
            scheduled += 1
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

    def _micro_batch_size(self) -> int | None:
        """With P pipeline stages, the running requests one plan takes at most (an even P-th, so P plans of other
        requests keep every stage busy); None without stages."""
        stages = self.config.pipeline_parallel_size
        return None if stages == 1 else -(-len(self._running) // stages)

    def _free_behind_windows(self) -> None:
        """Return the blocks each windowed KV table's window has passed: a request's next chunk starts at its
        computed count and its layers read back at most the window; steps planned before run (and read) before
        this one."""
        for table, window in enumerate(self.config.kv_windows):
            if window is not None:
                for request in self._running:
                    request.policy.free_behind_window(self, request, table, request.num_computed_tokens - window)

    def policy_for(self, request: RequestState) -> StepPolicy:
        """The step policy a new request runs under (step_policy.py)."""
        remote = request.params.kv_transfer_params
        if remote is not None and remote.do_remote_decode:
            return REMOTE_DECODE
        policy = BEAM if request.beam is not None else SPECULATIVE if request.speculates else PLAIN
        return RemotePrefillPolicy(policy) if remote is not None and remote.do_remote_prefill else policy

    def chunk_ask(self, request: RequestState, num_new: int) -> StepAsk:
        """`num_new` tokens after the request's computed ones, with the blocks they need."""
        return StepAsk(num_new, self._num_new_blocks(request.num_computed_tokens, len(request.block_ids), num_new))

    def _schedule_waiting(self, draft: PlanDraft) -> None:
        """Admit waiting requests in order with what their step policies ask for (`admit`, then `start`)."""
        while self._waiting and draft.budget > 0 and len(self._running) < self.config.max_num_seqs:
            request = self._waiting[0]
            ask = request.policy.admit(self, request, draft)
            # FCFS: nobody overtakes a request that cannot be admitted yet.
            if (ask is None or len(self._free_slots) < ask.num_slots or not self._blocks.can_allocate(ask.num_blocks)
                    or not self._adapter_fits(request)):
                if ask is not None and ask.cache_hit is not None and ask.cache_hit.tier_slots:
                    self.tier.prefetch(ask.cache_hit.tier_slots)  # read ahead what its admission will load
                return
            self._waiting.popleft()
            ask.cached_block_ids = self._prefix_cache.take(request, ask.cache_hit, draft.block_copies)
            request.mark_scheduled()
            request.status = RequestStatus.RUNNING
            slots = [heapq.heappop(self._free_slots) for _ in range(ask.num_slots)]
            self._running.append(request)
            request.policy.start(self, request, draft, ask, slots)

    def _adapter_fits(self, request: RequestState) -> bool:
        """Whether the request's LoRA adapter can run beside the running ones: at most --max-loras distinct
        adapters run at once (the workers' device slots)."""
        lora = request.params.lora
        if lora is None:
            return True
        running = {r.params.lora.lora_int_id for r in self._running if r.params.lora is not None}
        return lora.lora_int_id in running or len(running) < self.config.lora.max_loras

    def admission_ask(self, request: RequestState, draft: PlanDraft, num_slots: int) -> StepAsk | None:
        """The first chunk after the request's prefix-cache hits, with the blocks it needs and `num_slots` slots;
        None when no token can be computed this step."""
        hit = self._prefix_cache.lookup(request)
        num_computed = hit.num_tokens(self.config.block_size)
        num_new = self.num_new_tokens(request, num_computed, draft)
        if num_new == 0:
            return None
        # Hits that nobody references are free: sharing them (a partial hit's source while it is copied) leaves
        # fewer to allocate.
        num_blocks = (self._num_new_blocks(num_computed, hit.num_blocks, num_new)
                      + self._blocks.num_unreferenced(hit.blocks_to_share()))
        return StepAsk(num_new, num_blocks, num_slots=num_slots, cache_hit=hit)

    def start_request(self, draft: PlanDraft, request: RequestState, slot: int, params: SamplingParams) -> None:
        """The request enters `slot` with its known tokens; the worker samples for it with `params`."""
        request.slot = slot
        draft.new_requests.append(NewRequest(request_id=request.request_id, slot=slot,
                                             token_ids=request.known_token_ids(),
                                             num_prompt_tokens=request.num_prompt_tokens, params=params))

    def num_new_tokens(self, request: RequestState, num_computed: int, draft: PlanDraft) -> int:
        """Tokens to compute for `request` this step; 0 when its next sample would pass a limit."""
        num_new = min(request.num_tokens - num_computed, draft.budget)
        if num_new > 1 and draft.prefill is not None:
            num_new = draft.prefill.cap(num_computed, num_new)
        reaches_end = num_computed + num_new == request.num_tokens
        if reaches_end and not request.can_sample():
            return 0
        return num_new

    def _num_new_blocks(self, num_computed: int, num_held: int, num_new: int) -> int:
        """New blocks over every KV table, `num_held` per table before them."""
        # The blocks held always cover exactly the computed tokens, so this is never negative.
        return (self._blocks.blocks_for_tokens(num_computed + num_new) - num_held) * len(self.config.kv_windows)

    def add_chunk(self, draft: PlanDraft, request: RequestState, num_new: int,
                   cached_block_ids: list[int] | None = None, drafts: list[int] | None = None) -> None:
        if request.slot is None:
            raise RuntimeError(f"request {request.request_id} is scheduled without a slot")
        num_blocks = self._num_new_blocks(request.num_computed_tokens, len(request.block_ids), num_new)
        new_block_ids = self._blocks.allocate(num_blocks)
        request.extend_blocks(new_block_ids)
        if num_new > 1 and not drafts and draft.prefill is not None:
            draft.prefill.count(request.num_computed_tokens, num_new,
                                ends_prompt=request.num_computed_tokens + num_new == request.num_tokens)
        snapshots = self._prefix_cache.snapshots
        saves = [] if snapshots is None else snapshots.saves_for(request, request.num_computed_tokens,
                                                                 request.num_computed_tokens + num_new)
        draft.snapshot_saves.extend(saves)
        draft.chunks.append(ScheduledChunk(request.slot, request.num_computed_tokens, num_new, new_block_ids,
                                           cached_block_ids or [], drafts or [], self.drafts_after(request),
                                           state_load=request.state_load,
                                           state_saves=[(save.position, save.snapshot) for save in saves]))
        request.state_load = -1
        request.draft_token_ids = drafts or []
        request.num_computed_tokens += num_new
        draft.budget -= num_new
        self._prefix_cache.register_full_blocks(request)
        if request.num_computed_tokens == request.num_tokens:
            # The worker samples here; the next plan may already decode that token from its pool.
            request.num_placeholders += 1
            draft.samplers[request.slot] = (request, request.epoch)

    def drafts_after(self, request: RequestState) -> bool:
        """Whether the request drafts after its next step (it speculates and the speed gate is open)."""
        return request.speculates and self._speculation.gate.open

    def add_beam_step(self, draft: PlanDraft, request: RequestState) -> None:
        step = request.beam.plan_step(request.request_id, request.prompt_token_ids, self._blocks, self.config.block_size)
        draft.new_requests.extend(step.new_requests)
        draft.chunks.extend(step.chunks)
        draft.last_tokens.extend(step.last_tokens)
        draft.block_copies.extend(step.block_copies)
        draft.budget -= len(step.chunks)
        for chunk in step.chunks:
            draft.samplers[chunk.slot] = (request, request.epoch)
