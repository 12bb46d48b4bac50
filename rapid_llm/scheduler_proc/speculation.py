"""The scheduler's side of speculative decoding: who drafts, how many, and the rollback after verification.

The n-gram proposer runs here because the scheduler already holds every request's known tokens and the
lookup needs nothing else (no torch, no device): drafts go to the worker inside the decode chunk
(`ScheduledChunk.draft_token_ids`). A decoding request with k drafts computes 1 + k tokens; its drafts
count as tentative outputs, so budget, KV blocks and the max_tokens / max_model_len caps cover them.
Verification says how many were accepted (a); then a + 1 tokens become real, the computed count drops
back to the accepted prefix, and blocks that held only rejected positions are freed (drafts are never
in the prefix cache: blocks are registered from known tokens only). The worker is told the same cut by
a `Rollback` in the next plan. Async scheduling: the next plan cannot know a, so a speculating request
is never planned while one of its steps is in flight (other requests keep overlapping). A worker-side
proposer (draft model) drafts after each step instead: the result's drafts are `received` here and become
the request's next chunk, under the same limits. Two adaptive-off rules: per request by acceptance
(`spec_decode/adaptive.py`) and for the whole batch by measured speed (`spec_decode/speed_gate.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import Rollback
from rapid_llm.scheduler_proc.block_manager import BlockManager
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.spec_decode.adaptive import AdaptiveOff
from rapid_llm.spec_decode.registry import build_proposer, runs_in_worker
from rapid_llm.spec_decode.speed_gate import SpeedGate


@dataclass
class SpeculationCounters:
    num_drafts: int = 0  # verified draft sequences (one per speculating request and step)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: steps whose draft i was accepted


class Speculation:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.in_worker = runs_in_worker(config.method)
        self.proposer = None if self.in_worker else build_proposer(config)
        self.counters = SpeculationCounters()
        self.adaptive = AdaptiveOff(config)
        self.gate = SpeedGate(config.speed_check_window)
        # A worker proposer's drafts per request, with the token count they follow.
        self._received: dict[RequestState, tuple[int, list[int]]] = {}

    def propose(self, running: Sequence[RequestState]) -> dict[RequestState, list[int]]:
        """Drafts for every running request that may speculate now: it decodes (all its tokens known, all but
        the last computed), with room for at least one draft under max_tokens and max_model_len; none while the
        speed gate is closed."""
        if not self.gate.open:
            self._received.clear()
            return {}
        ready, limits = [], []
        for request in running:
            if not self.adaptive.may_draft(request) or not request.speculates or request.num_placeholders:
                continue
            if request.num_computed_tokens != request.num_tokens - 1:
                continue  # a prefill chunk never speculates
            limit = min(self.config.num_speculative_tokens, request.max_tokens - request.num_output_tokens - 1,
                        request.max_model_len - request.num_tokens - 1)
            if limit > 0:
                ready.append(request)
                limits.append(limit)
        if self.in_worker:
            return self._take_received(ready, limits)
        if not ready:
            return {}
        proposals = self.proposer.propose([request.known_token_ids() for request in ready], limits)
        self.adaptive.record_empty(ready, limits, proposals)
        return {request: proposal.token_ids for request, proposal in zip(ready, proposals) if proposal.token_ids}

    def received(self, request: RequestState, drafts: list[int]) -> None:
        """A worker proposer's drafts for what `request` knows now (its result's tokens added)."""
        if drafts:
            self._received[request] = (request.num_tokens, drafts)

    def _take_received(self, ready: list[RequestState], limits: list[int]) -> dict[RequestState, list[int]]:
        proposals = {}
        for request, limit in zip(ready, limits):
            num_tokens, drafts = self._received.pop(request, (-1, []))
            if num_tokens == request.num_tokens:
                proposals[request] = drafts[:limit]
        # Drafts of requests that finished or were preempted since are stale.
        self._received = {request: value for request, value in self._received.items()
                          if not request.is_finished and value[0] == request.num_tokens}
        return proposals

    def verified(self, request: RequestState, num_accepted: int, token_id: int,
                 blocks: BlockManager) -> list[int]:
        """Roll back the rejected drafts of `request` and return its new tokens (accepted drafts, then the
        target's token); blocks holding only rejected positions are freed."""
        drafts = request.draft_token_ids
        if not 0 <= num_accepted <= len(drafts):
            raise ValueError(f"request {request.request_id}: {num_accepted} drafts accepted of {len(drafts)}")
        self.counters.num_drafts += 1
        self.counters.num_draft_tokens += len(drafts)
        self.counters.num_accepted_tokens += num_accepted
        per_position = self.counters.accepted_per_position
        per_position.extend([0] * (num_accepted - len(per_position)))
        for position in range(num_accepted):
            per_position[position] += 1
        request.draft_token_ids = []
        # The accepted drafts become placeholders like the target's token, each replaced as it is appended.
        request.num_placeholders += num_accepted
        request.num_computed_tokens -= len(drafts) - num_accepted
        keep = blocks.blocks_for_tokens(request.num_computed_tokens)
        blocks.free(reversed(request.block_ids[keep:]))
        del request.block_ids[keep:]
        self.adaptive.record(request, len(drafts), num_accepted)
        return [*drafts[:num_accepted], token_id]

    @staticmethod
    def rollback(request: RequestState) -> Rollback:
        """What the worker must cut for a request that speculated and goes on."""
        if request.slot is None:
            raise RuntimeError(f"request {request.request_id} has no slot to roll back")
        return Rollback(request.slot, request.num_tokens, len(request.block_ids))
