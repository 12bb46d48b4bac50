"""Step policies: a request's lifecycle in the scheduler, one per request kind, so the scheduler never branches on it.

Admission: `admit` says what starting this step takes (slots, tokens, blocks, prefix hits; None: not now, and
nobody behind it starts either), the scheduler checks the slots and blocks and pops the slots, `start` tells the
worker and adds the first chunk. Each step: `ask` (None: nothing this step), preemption until the blocks fit, `add`.
Each result: `take` per sampled slot, then `end_step` once all are taken. Resources: `slots_of`, `blocks_of`,
`free_behind_window`, `release` (at the end or a preemption). Plain decoding asks for the next prompt chunk or one
token; speculative decoding one token plus drafts (nothing while its previous drafts' accepted count is unknown);
beam search holds W slots from admission, asks for one token per beam once its prompt is done (nothing while a
round is in flight), collects every beam's logprobs in `take` and ranks the round in `end_step`. Disaggregation: a
prefill instance's request leases its prompt's blocks when it ends; a decode instance's is staged until its KV is
loaded, then admitted as a prefix hit. Key design choice: a new lifecycle is a new policy returned by
`Scheduler.policy_for`, not a branch in the loops. Usage: the scheduler calls these; a policy moves requests with the
scheduler's public methods (`add_chunk`, `add_tokens`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid_llm.ipc.messages import StepResult
    from rapid_llm.sampling import SamplingParams
    from rapid_llm.scheduler_proc.plan_record import PlanDraft
    from rapid_llm.scheduler_proc.prefix_cache import CacheHit
    from rapid_llm.scheduler_proc.request_state import RequestState
    from rapid_llm.scheduler_proc.scheduler import Scheduler


@dataclass
class StepAsk:
    """What a request takes from this step: tokens of the budget, new KV blocks, and drafts to verify; when it is
    admitted, also its slots and the prefix-cache hit it starts from (`cached_block_ids` once it is taken)."""

    num_new: int
    num_blocks: int
    drafts: list[int] = field(default_factory=list)
    num_slots: int = 0
    cache_hit: CacheHit | None = None
    cached_block_ids: list[int] = field(default_factory=list)


class StepPolicy:
    """Plain decoding: the next prompt chunk (under the budget and the step cost's cuts) or one decode token."""

    def admit(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        """What starting this step takes; None: not this step (first come, first served: nobody overtakes it)."""
        return scheduler.admission_ask(request, draft, num_slots=1)

    def start(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft, ask: StepAsk,
              slots: list[int]) -> None:
        """Admitted with `slots` (`ask.num_slots` free ones, now held): tell the worker, add the first chunk."""
        scheduler.start_request(draft, request, slots[0], self.worker_params(request))
        scheduler.add_chunk(draft, request, ask.num_new, cached_block_ids=ask.cached_block_ids)

    def worker_params(self, request: RequestState) -> SamplingParams:
        """The sampling parameters the worker samples the request's slot with."""
        return request.params

    def slots_of(self, request: RequestState) -> list[int]:
        """The slots it holds; `release` returns them."""
        return [] if request.slot is None else [request.slot]

    def blocks_of(self, request: RequestState) -> list[int]:
        """The KV blocks it holds, a shared one once per reference."""
        return request.held_block_ids()

    def free_behind_window(self, scheduler: Scheduler, request: RequestState, table: int, position: int) -> None:
        """The window of a KV table's layers has passed `position`: its blocks wholly before it go back to the pool."""
        scheduler.block_manager.free(request.release_blocks_before(table, position))

    def release(self, scheduler: Scheduler, request: RequestState) -> None:
        """It ended or is preempted: its blocks and slots go back now (the worker runs steps in order, so no later
        step reads them). Full blocks stay cached; freeing the last block first makes the prefix's tail evicted
        first."""
        scheduler.free_blocks_of(request)
        scheduler.release_slots(self.slots_of(request))
        request.slot = None

    def ask(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        num_new = scheduler.num_new_tokens(request, request.num_computed_tokens, draft)
        return scheduler.chunk_ask(request, num_new) if num_new else None

    def add(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft, ask: StepAsk) -> None:
        scheduler.add_chunk(draft, request, ask.num_new, drafts=ask.drafts)

    def take(self, scheduler: Scheduler, request: RequestState, slot: int, index: int, result: StepResult) -> None:
        """The token sampled in `slot`, entry `index` of `result` (never stale: the scheduler drops those)."""
        scheduler.add_tokens(request, [result.token_ids[index]], result.logprobs[index] if result.logprobs else None)

    def end_step(self, scheduler: Scheduler, request: RequestState) -> None:
        """Every slot the request sampled in this step has been taken (each taker of a step gets this once)."""


class SpeculativePolicy(StepPolicy):
    """One token plus the proposer's drafts; waits while its previous step's accepted count is unknown."""

    def ask(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        if request.num_placeholders and (request.draft_token_ids or scheduler.drafts_after(request)):
            return None
        drafts = draft.proposals.get(request, [])[: draft.budget - 1]
        if not drafts:
            return super().ask(scheduler, request, draft)
        ask = scheduler.chunk_ask(request, 1 + len(drafts))
        ask.drafts = drafts
        return ask

    def take(self, scheduler: Scheduler, request: RequestState, slot: int, index: int, result: StepResult) -> None:
        if request.draft_token_ids:
            scheduler.verify_drafts(request, slot, index, result)
        else:
            super().take(scheduler, request, slot, index, result)
        # A worker proposer drafts after every step of a request that drafts, its prompt's last chunk included.
        scheduler.receive_drafts(request, index, result)


class BeamPolicy(StepPolicy):
    """W slots from admission to the end; prompt chunks as plain decoding, then one token per beam, one round in
    flight at a time."""

    def admit(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        # A slot per beam, reserved up front: a round must never wait for slots held by others.
        return scheduler.admission_ask(request, draft, num_slots=request.beam.width)

    def start(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft, ask: StepAsk,
              slots: list[int]) -> None:
        # Nothing of a beam search is sent before it ends, so each admission (a preemption's too) starts it afresh;
        # the prompt is prefilled once, in the first slot.
        request.beam.restart(slots)
        super().start(scheduler, request, draft, ask, slots)

    def worker_params(self, request: RequestState) -> SamplingParams:
        # The worker returns each beam's top candidates; the group, not the sampler, chooses the tokens.
        return request.beam.worker_params

    def slots_of(self, request: RequestState) -> list[int]:
        return list(request.beam.slots)

    def blocks_of(self, request: RequestState) -> list[int]:
        # Once started, the prompt's blocks belong to the beams.
        return list(request.beam.block_ids()) if request.beam.started else request.held_block_ids()

    def free_behind_window(self, scheduler: Scheduler, request: RequestState, table: int, position: int) -> None:
        """Nothing: the prompt's blocks become the root beam's, and forked beams share them by reference."""

    def release(self, scheduler: Scheduler, request: RequestState) -> None:
        super().release(scheduler, request)
        request.beam.release(scheduler.block_manager)

    def ask(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        group = request.beam
        if not group.started:
            # The prompt's last chunk samples the first round (a placeholder until its result starts the group).
            return None if request.num_placeholders else super().ask(scheduler, request, draft)
        if group.in_flight or draft.budget < len(group.beams):
            return None
        return StepAsk(len(group.beams), group.num_blocks_needed(scheduler.config.block_size))

    def add(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft, ask: StepAsk) -> None:
        if request.beam.started:
            scheduler.add_beam_step(draft, request)
        else:
            super().add(scheduler, request, draft, ask)

    def take(self, scheduler: Scheduler, request: RequestState, slot: int, index: int, result: StepResult) -> None:
        # A round is ranked over all beams at once: nothing is appended until every beam's candidates are in.
        request.beam.round[slot] = result.logprobs[index] if result.logprobs else None

    def end_step(self, scheduler: Scheduler, request: RequestState) -> None:
        scheduler.advance_beams(request)


class RemoteDecodePolicy(StepPolicy):
    """Plain decoding on a prefill instance; a request that ends by length (its prompt computed) first leases its
    prompt's full blocks to a decode instance (remote_kv.py), then releases the rest."""

    def release(self, scheduler: Scheduler, request: RequestState) -> None:
        if request.finish_reason == "length":
            request.kv_transfer_out = scheduler.remote_kv.lease(request)
        super().release(scheduler, request)


class RemotePrefillPolicy(StepPolicy):
    """A decode instance's request whose prompt KV a prefill instance computed: staged until the load ends
    (remote_kv.py), then admitted as `inner` admits it (the loaded blocks are prefix hits), and `inner` from then on."""

    def __init__(self, inner: StepPolicy) -> None:
        self.inner = inner

    def admit(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        return self.inner.admit(scheduler, request, draft)

    def start(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft, ask: StepAsk,
              slots: list[int]) -> None:
        # The hits are taken (shared) before `start`: the load's pin on them can go.
        request.policy = self.inner
        scheduler.remote_kv.admitted(request)
        self.inner.start(scheduler, request, draft, ask, slots)

    def release(self, scheduler: Scheduler, request: RequestState) -> None:
        scheduler.remote_kv.drop(request)
        self.inner.release(scheduler, request)


PLAIN = StepPolicy()
SPECULATIVE = SpeculativePolicy()
BEAM = BeamPolicy()
REMOTE_DECODE = RemoteDecodePolicy()
