"""Step policies: what a running request asks of each step, one implementation per request kind.

The scheduler's loop is the same for every request: ask its policy for this step's tokens and blocks (None:
nothing this step), preempt until the blocks fit, then let the policy add its chunks to the plan. Plain
decoding asks for the next prompt chunk or one decode token; speculative decoding for one token plus its
drafts, or nothing while the accepted count of its previous drafts is unknown; beam search for one token per
beam once its prompt is done, and nothing while a round is in flight. A new lifecycle (e.g. a request whose KV
arrives from a remote prefill) is a new policy returned by `Scheduler.policy_for`, not a branch in the loop.
Usage: `ask = request.policy.ask(scheduler, request, draft)`; `request.policy.add(scheduler, request, draft, ask)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid_llm.scheduler_proc.request_state import RequestState
    from rapid_llm.scheduler_proc.scheduler import Scheduler, _PlanDraft


@dataclass
class StepAsk:
    """What a request takes from this step: tokens of the budget, new KV blocks, and drafts to verify."""

    num_new: int
    num_blocks: int
    drafts: list[int] = field(default_factory=list)


class StepPolicy:
    """Plain decoding: the next prompt chunk (under the budget and the step cost's cuts) or one decode token."""

    def ask(self, scheduler: Scheduler, request: RequestState, draft: _PlanDraft) -> StepAsk | None:
        num_new = scheduler.num_new_tokens(request, request.num_computed_tokens, draft)
        return scheduler.chunk_ask(request, num_new) if num_new else None

    def add(self, scheduler: Scheduler, request: RequestState, draft: _PlanDraft, ask: StepAsk) -> None:
        scheduler.add_chunk(draft, request, ask.num_new, drafts=ask.drafts)


class SpeculativePolicy(StepPolicy):
    """One token plus the proposer's drafts; waits while its previous step's accepted count is unknown."""

    def ask(self, scheduler: Scheduler, request: RequestState, draft: _PlanDraft) -> StepAsk | None:
        if request.num_placeholders and (request.draft_token_ids or scheduler.drafts_after(request)):
            return None
        drafts = draft.proposals.get(request, [])[: draft.budget - 1]
        if not drafts:
            return super().ask(scheduler, request, draft)
        ask = scheduler.chunk_ask(request, 1 + len(drafts))
        ask.drafts = drafts
        return ask


class BeamPolicy(StepPolicy):
    """Prompt chunks as plain decoding; then one token per beam, one round in flight at a time."""

    def ask(self, scheduler: Scheduler, request: RequestState, draft: _PlanDraft) -> StepAsk | None:
        group = request.beam
        if not (group.in_flight or group.started):
            return super().ask(scheduler, request, draft)
        if group.in_flight or draft.budget < len(group.beams):
            return None
        return StepAsk(len(group.beams), group.num_blocks_needed(scheduler.config.block_size))

    def add(self, scheduler: Scheduler, request: RequestState, draft: _PlanDraft, ask: StepAsk) -> None:
        if request.beam.started:
            scheduler.add_beam_step(draft, request)
        else:
            super().add(scheduler, request, draft, ask)


PLAIN = StepPolicy()
SPECULATIVE = SpeculativePolicy()
BEAM = BeamPolicy()
