"""Step policies: what a running request asks of each step and how it takes the result, one per request kind.

The scheduler's loops are the same for every request. Planning asks the policy for this step's tokens and blocks
(None: nothing this step), preempts until the blocks fit, then lets the policy add its chunks to the plan; the
result hands each of the request's sampled slots to `take`, then calls `end_step` once all slots of the step
are taken. Plain decoding asks for the next prompt chunk or one decode token and appends its token; speculative
decoding asks for one token plus its drafts (nothing while the accepted count of its previous drafts is unknown)
and keeps the accepted ones; beam search asks for one token per beam once its prompt is done (nothing while a
round is in flight), collects every beam's logprobs in `take` and ranks the round once in `end_step`. A new
lifecycle (e.g. a request whose KV arrives from a remote prefill) is a new policy returned by
`Scheduler.policy_for`, not a branch in the loops. Usage: `ask = policy.ask(scheduler, request, draft)`,
`policy.add(scheduler, request, draft, ask)`; per result `policy.take(scheduler, request, slot, index, result)`,
then `policy.end_step(scheduler, request)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid_llm.ipc.messages import StepResult
    from rapid_llm.scheduler_proc.plan_record import PlanDraft
    from rapid_llm.scheduler_proc.request_state import RequestState
    from rapid_llm.scheduler_proc.scheduler import Scheduler


@dataclass
class StepAsk:
    """What a request takes from this step: tokens of the budget, new KV blocks, and drafts to verify."""

    num_new: int
    num_blocks: int
    drafts: list[int] = field(default_factory=list)


class StepPolicy:
    """Plain decoding: the next prompt chunk (under the budget and the step cost's cuts) or one decode token."""

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
    """Prompt chunks as plain decoding; then one token per beam, one round in flight at a time."""

    def ask(self, scheduler: Scheduler, request: RequestState, draft: PlanDraft) -> StepAsk | None:
        group = request.beam
        if not (group.in_flight or group.started):
            return super().ask(scheduler, request, draft)
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


PLAIN = StepPolicy()
SPECULATIVE = SpeculativePolicy()
BEAM = BeamPolicy()
