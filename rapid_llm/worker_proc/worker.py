"""Worker: applies the scheduler's per-step deltas to the runner's input batch and launches the step.

The scheduler sends only what changed (released slots, new or resumed requests, tokens to
compute, prefix-cache hits and newly allocated blocks; only the latter are zeroed; for beam search the
tokens it chose and the blocks to copy; for speculative decoding the drafts to verify and, after a result,
the rollback of the rejected ones). The runner's
persistent input batch keeps each slot's tokens, block table and sampling row, so a step message stays
small however long the requests are, and nothing is rebuilt from lists. A request whose state cannot be
prepared when it is added fails alone: its slot is skipped (and reported in `StepResult.failures`) until
the scheduler releases it, and the rest of every step runs without it. `launch` returns before the step's
tokens are on the host (`finish` waits for them), so the process loop can launch the next plan first,
unless a slot has structured output (`can_overlap`): its next mask needs this step's token.
`execute_plan` does both at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import msgspec

from rapid_llm.ipc.messages import NewRequest, ScheduledChunk, SlotFailure, StepPlan, StepResult
from rapid_llm.structured.compiler import GrammarCompilerPool
from rapid_llm.structured.manager import StructuredOutputs
from rapid_llm.worker_proc.cpu_threads import CpuThreadPolicy
from rapid_llm.worker_proc.deferred_output import PendingOutput
from rapid_llm.worker_proc.kv_tier import KVTier
from rapid_llm.worker_proc.model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class PendingResult:
    """A launched step: its StepResult once the sampled tokens have reached the host."""

    step_id: int
    chunks: list[ScheduledChunk]
    output: PendingOutput | None
    failures: list[SlotFailure]
    launched_at: float  # time.perf_counter() when the plan arrived at `launch`
    tier_error: str = ""  # the offload tier's failure, reported once

    def result(self) -> StepResult:
        output = self.output.result() if self.output is not None else None
        seconds = time.perf_counter() - self.launched_at
        if output is None:
            return StepResult(step_id=self.step_id, slots=[], token_ids=[], failures=self.failures,
                              step_seconds=seconds, kv_tier_error=self.tier_error)
        return StepResult(
            step_id=self.step_id,
            slots=[self.chunks[row].slot for row in output.rows],
            token_ids=output.token_ids,
            logprobs=output.logprobs if any(output.logprobs) else [],
            num_accepted=output.num_accepted,
            draft_token_ids=output.draft_token_ids,
            failures=self.failures,
            prompt_logprobs=output.prompt_logprobs,
            step_seconds=seconds,
            pooled=output.pooled,
            kv_tier_error=self.tier_error,
        )


class Worker:
    def __init__(self, runner: ModelRunner, tokenizer: str | None = None,
                 thread_policy: CpuThreadPolicy | None = None, tier: KVTier | None = None) -> None:
        """`tokenizer`: the directory structured output builds its vocabulary from (default: the model's);
        `thread_policy`: the CPU thread count for each step by its token count (None: left as it is); `tier`: the
        KV offload tier the plans save into and load from."""
        self.runner = runner
        self.thread_policy = thread_policy
        self.tier = tier
        model = runner.model_config
        self.structured = StructuredOutputs(GrammarCompilerPool(
            tokenizer or model.model, model.vocab_size, model.eos_token_ids, model.trust_remote_code))
        self.failed_slots: dict[int, SlotFailure] = {}  # until the scheduler releases the slot

    def execute_plan(self, plan: StepPlan) -> StepResult:
        return self.finish(self.launch(plan))

    @property
    def can_overlap(self) -> bool:
        """Whether the next plan may be launched before this step's tokens are accepted."""
        return not self.structured.active

    def finish(self, pending: PendingResult) -> StepResult:
        """The step's result once its tokens are on the host, with each constrained slot's matcher advanced;
        a token its grammar rejects fails that request alone and is dropped."""
        result = pending.result()
        rejected = self.structured.accept(result.slots, result.token_ids)
        if not rejected:
            return result
        kept = [i for i, slot in enumerate(result.slots) if slot not in rejected]
        return msgspec.structs.replace(
            result, slots=[result.slots[i] for i in kept], token_ids=[result.token_ids[i] for i in kept],
            logprobs=[result.logprobs[i] for i in kept] if result.logprobs else [],
            num_accepted=[result.num_accepted[i] for i in kept] if result.num_accepted else [],
            draft_token_ids=[result.draft_token_ids[i] for i in kept] if result.draft_token_ids else [],
            failures=[*result.failures, *self._fail_slots(rejected)])

    def launch(self, plan: StepPlan) -> PendingResult:
        launched_at = time.perf_counter()
        # A pipeline stage may still be receiving an earlier step's tokens: those of the slots this plan touches
        # are recorded first.
        self.runner.settle({*plan.released_slots, *(new.slot for new in plan.new_requests),
                            *(chunk.slot for chunk in plan.scheduled), *(last.slot for last in plan.last_tokens),
                            *(rollback.slot for rollback in plan.rollbacks)})
        if self.thread_policy is not None:
            self.thread_policy.apply(sum(chunk.num_new_tokens for chunk in plan.scheduled),
                                     sum(chunk.num_computed_tokens + chunk.num_new_tokens for chunk in plan.scheduled))
        for rollback in plan.rollbacks:
            self.runner.rollback(rollback.slot, rollback.num_tokens, rollback.num_blocks)
        self.runner.release(plan.released_slots)
        for slot in plan.released_slots:
            self.failed_slots.pop(slot, None)
            self.structured.remove(slot)
        for new in plan.new_requests:
            try:
                self.add_request(new)
            except Exception as error:
                # Anything raised while preparing one request's state is that request's own; a device
                # fault would raise again in the step's forward below, which still ends the worker.
                logger.exception("request %s failed while being added; it is aborted", new.request_id)
                self.failed_slots[new.slot] = SlotFailure(new.slot, new.request_id, f"{type(error).__name__}: {error}")
        # A plan made before the scheduler learnt of a failure may still schedule the failed slot.
        failures = [self.failed_slots[chunk.slot] for chunk in plan.scheduled if chunk.slot in self.failed_slots]
        chunks = [chunk for chunk in plan.scheduled if chunk.slot not in self.failed_slots]
        if plan.last_tokens:
            self.runner.set_last_tokens([last.slot for last in plan.last_tokens],
                                        [last.token_id for last in plan.last_tokens])
        if (plan.tier_saves or plan.tier_loads) and self.tier is None:
            raise ValueError(f"step {plan.step_id} uses a KV offload tier this worker does not keep")
        staged = self.tier.stage([(save.block, save.slot) for save in plan.tier_saves]) if plan.tier_saves else []
        if plan.block_copies:
            # Copy-on-write targets are not zeroed (they ride in cached_block_ids): the copy fills them whole. Copied
            # before the zeroing, because a partial prefix hit's source may be evicted and handed out fresh by this
            # very plan.
            self.runner.copy_blocks([copy.src for copy in plan.block_copies], [copy.dst for copy in plan.block_copies])
        # Only fresh blocks: prefix-cache hits hold KV that this or an earlier step writes.
        self.runner.clear_blocks([block for chunk in chunks for block in chunk.new_block_ids])
        tier_error = ""
        if self.tier is not None:
            # Loads before the saves are kept: a plan may load a slot that one of its saves overwrites.
            self.tier.load([(load.slot, load.block) for load in plan.tier_loads])
            self.tier.commit(staged)
            self.tier.prefetch(plan.tier_prefetch)
            tier_error = self.tier.take_error()
        for chunk in chunks:
            if not self.runner.holds_request(chunk.slot):
                raise ValueError(f"step {plan.step_id} schedules slot {chunk.slot}, which holds no request")
            if chunk.cached_block_ids:
                self.runner.append_blocks(chunk.slot, chunk.cached_block_ids)
            if chunk.new_block_ids:
                self.runner.append_blocks(chunk.slot, chunk.new_block_ids)
        self.runner.set_draft_after([chunk.slot for chunk in chunks], [chunk.draft_after for chunk in chunks])
        drafting = [chunk for chunk in chunks if chunk.draft_token_ids]
        if drafting:
            self.runner.write_drafts([chunk.slot for chunk in drafting], [chunk.draft_token_ids for chunk in drafting])
        if self.structured.active:
            # A sampling request whose grammar cannot be built fails alone, before the step.
            failures += self._fail_slots(self.structured.wait_for_grammars(
                [chunk.slot for chunk in chunks if self.runner.samples(chunk)]))
            chunks = [chunk for chunk in chunks if chunk.slot not in self.failed_slots]
        output = self.runner.launch(chunks, self.structured) if chunks else None
        return PendingResult(plan.step_id, chunks, output, failures, launched_at, tier_error)

    def add_request(self, new: NewRequest) -> None:
        """Prepare the slot's state; raises if the request cannot be served, leaving the slot empty."""
        self.runner.start_request(new.request_id, new.slot, new.token_ids, new.num_prompt_tokens, new.params)
        self.structured.add(new.slot, new.params, new.token_ids[new.num_prompt_tokens:])

    def _fail_slots(self, errors: dict[int, str]) -> list[SlotFailure]:
        """Fail these slots' requests alone (kept failed until the scheduler releases the slot)."""
        for slot, error in errors.items():
            self.failed_slots[slot] = SlotFailure(slot, self.runner.request_id(slot), error)
        return [self.failed_slots[slot] for slot in errors]
