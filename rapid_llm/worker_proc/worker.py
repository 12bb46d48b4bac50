"""Worker: applies the scheduler's per-step deltas to its own request states and runs the step.

The scheduler sends only what changed (released slots, new or resumed requests, tokens to
compute, prefix-cache hits and newly allocated blocks; only the latter are zeroed). The worker
keeps each slot's tokens, block table and sampling parameters, so a step message stays small
however long the requests are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rapid_llm.ipc.messages import StepPlan, StepResult
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner, ScheduledRequest


@dataclass
class SlotState:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    block_table: list[int] = field(default_factory=list)


class Worker:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.slots: dict[int, SlotState] = {}

    def execute_plan(self, plan: StepPlan) -> StepResult:
        for slot in plan.released_slots:
            self.slots.pop(slot, None)
        for new in plan.new_requests:
            prompt = new.token_ids[: new.num_prompt_tokens]
            self.slots[new.slot] = SlotState(new.request_id, prompt, new.token_ids[new.num_prompt_tokens :], new.params)
            self.runner.add_request(new.slot, new.token_ids)
        # Only fresh blocks: prefix-cache hits hold KV that this or an earlier step writes.
        self.runner.clear_blocks([block for chunk in plan.scheduled for block in chunk.new_block_ids])
        requests: list[ScheduledRequest] = []
        for chunk in plan.scheduled:
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
        output = self.runner.execute(requests)
        slots = [requests[row].slot for row in output.rows]
        for slot, token in zip(slots, output.token_ids):
            self.slots[slot].output_token_ids.append(token)
        return StepResult(
            step_id=plan.step_id,
            slots=slots,
            token_ids=output.token_ids,
            logprobs=output.logprobs if any(output.logprobs) else [],
        )
