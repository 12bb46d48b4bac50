"""Worker: applies the scheduler's per-step deltas to its own request states and runs the step.

The scheduler sends only what changed (released slots, new or resumed requests, tokens to
compute, prefix-cache hits and newly allocated blocks; only the latter are zeroed). The worker
keeps each slot's tokens, block table and sampling parameters, so a step message stays small
however long the requests are. A request whose state cannot be prepared when it is added fails
alone: its slot is skipped (and reported in `StepResult.failures`) until the scheduler releases
it, and the rest of every step runs without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rapid_llm.ipc.messages import NewRequest, SlotFailure, StepPlan, StepResult
from rapid_llm.sampling import SamplingParams
from rapid_llm.structured.compiler import GrammarCompilerPool
from rapid_llm.structured.manager import StructuredOutputs
from rapid_llm.worker_proc.model_runner import ModelRunner, ScheduledRequest, StepOutput

logger = logging.getLogger(__name__)


@dataclass
class SlotState:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    block_table: list[int] = field(default_factory=list)


class Worker:
    def __init__(self, runner: ModelRunner, tokenizer: str | None = None) -> None:
        """`tokenizer`: the directory structured output builds its vocabulary from (default: the model's)."""
        self.runner = runner
        model = runner.model_config
        self.structured = StructuredOutputs(GrammarCompilerPool(
            tokenizer or model.model, model.vocab_size, model.eos_token_ids, model.trust_remote_code))
        self.slots: dict[int, SlotState] = {}
        self.failed_slots: dict[int, SlotFailure] = {}  # until the scheduler releases the slot

    def execute_plan(self, plan: StepPlan) -> StepResult:
        for slot in plan.released_slots:
            self.slots.pop(slot, None)
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
        # Only fresh blocks: prefix-cache hits hold KV that this or an earlier step writes.
        self.runner.clear_blocks([block for chunk in chunks for block in chunk.new_block_ids])
        requests: list[ScheduledRequest] = []
        for chunk in chunks:
            state = self.slots.get(chunk.slot)
            if state is None:
                raise ValueError(f"step {plan.step_id} schedules slot {chunk.slot}, which holds no request")
            state.block_table.extend(chunk.cached_block_ids)
            state.block_table.extend(chunk.new_block_ids)
            requests.append(ScheduledRequest(
                request_id=state.request_id,
                slot=chunk.slot,
                prompt_token_ids=state.prompt_token_ids,
                output_token_ids=state.output_token_ids,
                num_computed_tokens=chunk.num_computed_tokens,
                num_new_tokens=chunk.num_new_tokens,
                block_table=state.block_table,
                sampling_params=state.params,
            ))
        # Structured output: a sampling request whose grammar cannot be built fails alone, before the step.
        failures += self._fail_slots(self.structured.wait_for_grammars(requests))
        requests = [request for request in requests if request.slot not in self.failed_slots]
        output = self.runner.execute(requests, self.structured) if requests else StepOutput([], [], [])
        slots = [requests[row].slot for row in output.rows]
        rejected = self.structured.accept(slots, output.token_ids)
        if rejected:
            failures += self._fail_slots(rejected)
            kept = [i for i, slot in enumerate(slots) if slot not in rejected]
            slots = [slots[i] for i in kept]
            output.token_ids, output.logprobs = [output.token_ids[i] for i in kept], [output.logprobs[i] for i in kept]
        for slot, token in zip(slots, output.token_ids):
            self.slots[slot].output_token_ids.append(token)
        return StepResult(
            step_id=plan.step_id,
            slots=slots,
            token_ids=output.token_ids,
            logprobs=output.logprobs if any(output.logprobs) else [],
            failures=failures,
            prompt_logprobs=output.prompt_logprobs,
        )

    def add_request(self, new: NewRequest) -> None:
        """Prepare the slot's state; raises if the request cannot be served, leaving the slot empty."""
        prompt, outputs = new.token_ids[: new.num_prompt_tokens], new.token_ids[new.num_prompt_tokens :]
        self.runner.check_sampling(new.params, prompt, outputs)
        self.runner.add_request(new.slot, new.token_ids)
        self.structured.add(new.slot, new.params, outputs)
        self.slots[new.slot] = SlotState(new.request_id, prompt, outputs, new.params)

    def _fail_slots(self, errors: dict[int, str]) -> list[SlotFailure]:
        """Fail these slots' requests alone (kept failed until the scheduler releases the slot)."""
        for slot, error in errors.items():
            self.failed_slots[slot] = SlotFailure(slot, self.slots[slot].request_id, error)
        return [self.failed_slots[slot] for slot in errors]
