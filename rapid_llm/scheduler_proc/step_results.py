"""Taking a step's result: each sampled token goes, through the plan's record, to its request's step policy.

Failures come first (recomputing the requests that read a failed request's blocks makes their tokens of this step
stale), then prompt logprobs and pooled prompts (the chunk that ends a prompt also samples the first token, whose
update carries them out), then the tokens; a token of a request that finished, was aborted or was preempted since
the plan was made is dropped. Key design choice: no branch per request kind here. `policy.take` gets each live
token in slot order, and `policy.end_step` once per request that took one, after all have: beam search collects
every beam's slot of the round in `take` and ranks the round once in `end_step`. The moves policies make are
methods here: `add_tokens`, `verify_drafts`, `receive_drafts`, `advance_beams`.
Usage: `Scheduler.process_result(result)`, for each step in the order the steps were planned.
"""

from __future__ import annotations

import time

from rapid_llm.ipc.messages import StepResult, TokenLogprobs
from rapid_llm.scheduler_proc.plan_record import StepRecord
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.scheduler_proc.scheduler_state import SchedulerState
from rapid_llm.scheduler_proc.speculation import Speculation


class StepResults(SchedulerState):
    """The scheduler's result intake; `Scheduler` adds planning on top."""

    def process_result(self, result: StepResult) -> None:
        record = self._pop_record(result)
        self._num_steps_done += 1
        if record.snapshot_saves:
            self._prefix_cache.snapshots.commit(record.snapshot_saves, {failure.slot for failure in result.failures})
        if result.step_seconds > 0:
            self._step_cost.observe(record.features, result.step_seconds)
        if result.kv_tier_error and self.tier is not None:
            self.tier.disable(result.kv_tier_error)
        # Failures first: recomputing the requests that read a failed request's blocks makes this
        # step's tokens of theirs stale (their epoch changes), so they are dropped below.
        for failure in result.failures:
            request = self._requests.get(failure.request_id)
            # A failure reported again for a slot already released, or a request preempted since
            # (it fails again, and is reported again, if it comes back) ends nothing.
            if request is not None and failure.slot in request.policy.slots_of(request):
                self._fail(request, failure.error)
        self._prefix_cache.reported(result.step_id)
        # Before the tokens: the chunk that ends a prompt also samples its first token, which carries them out.
        for chunk in result.prompt_logprobs:
            request = self._requests.get(chunk.request_id)
            if request is not None and not request.is_finished:
                request.add_prompt_logprobs(chunk.start, chunk.entries)
        for pooled in result.pooled:
            request = self._requests.get(pooled.request_id)
            if request is not None and not request.is_finished:
                request.unsent_embedding = pooled.values
        taken: dict[RequestState, None] = {}  # ordered set: who gets `end_step`, in the order of their first token
        for index, slot in enumerate(result.slots):
            request, epoch = record.samplers[slot]
            # Finished, aborted or preempted since this step was planned: the token is stale.
            if request.is_finished or request.epoch != epoch:
                continue
            request.policy.take(self, request, slot, index, result)
            taken[request] = None
        for request in taken:
            request.policy.end_step(self, request)
        if self._speculation is not None:
            self._speculation.gate.step_done(record.decode_only, len(self._running),
                                             len(result.slots) + sum(result.num_accepted))

    def add_tokens(self, request: RequestState, token_ids: list[int], logprobs: TokenLogprobs | None) -> None:
        """Append sampled tokens (several after verified drafts) until one finishes the request."""
        for token_id in token_ids:
            request.add_sampled_token(token_id, logprobs)
            self._prefix_cache.register_full_blocks(request)
            self._updated[request] = None
            finish = request.finish_reason_for_last_token(self.config.eos_token_ids)
            if finish is not None:
                self._finish(request, *finish)
                return

    def verify_drafts(self, request: RequestState, slot: int, index: int, result: StepResult) -> None:
        """Append the drafts the worker accepted and its own token; the next plan tells the worker the cut."""
        if not result.num_accepted:
            raise ValueError(f"step {result.step_id}: slot {slot} verified drafts, but no num_accepted came back")
        self.add_tokens(request, self._speculation.verified(request, result.num_accepted[index],
                                                            result.token_ids[index], self._blocks), None)
        if not request.is_finished:
            self._rollbacks[slot] = Speculation.rollback(request)

    def receive_drafts(self, request: RequestState, index: int, result: StepResult) -> None:
        """Keep a worker proposer's drafts for the request's next step (they follow the tokens just added)."""
        if result.draft_token_ids and self._speculation is not None and not request.is_finished:
            self._speculation.received(request, result.draft_token_ids[index])

    def advance_beams(self, request: RequestState) -> None:
        """One round of a beam group's collected results: rank, fork the next beams, or finish with the best."""
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
        self._released_slots.extend(group.advance_round(request.request_id, self._blocks, self.config.block_size))
        if group.search.done:
            request.beam_outputs = group.best_sequences()
            best = request.beam_outputs[0]
            self._finish(request, best.finish_reason, best.stop_reason)

    def _pop_record(self, result: StepResult) -> StepRecord:
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
