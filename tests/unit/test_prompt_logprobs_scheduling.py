"""Scheduler side of prompt logprobs: such requests skip prefix-cache hits, and the worker's per-chunk
reports reach the client once, in order, with the first token -- even when a preempted request's
prompt is scored again."""

from __future__ import annotations

from rapid_llm.ipc.messages import PromptLogprobs, StepResult, TokenLogprobs
from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import make_config, request

PROMPT = list(range(5, 17))  # 3 full blocks of 4


def entries(start: int, stop: int) -> list[TokenLogprobs]:
    return [TokenLogprobs(-float(i)) for i in range(start, stop)]


def run_one_step(scheduler: Scheduler, prompt_logprobs: list[PromptLogprobs] | None = None) -> None:
    plan = scheduler.schedule()
    assert plan is not None
    slots = [chunk.slot for chunk in plan.scheduled if chunk.num_computed_tokens + chunk.num_new_tokens
             >= len(PROMPT)]
    scheduler.process_result(StepResult(plan.step_id, slots, [7] * len(slots), prompt_logprobs=prompt_logprobs or []))


def test_a_prompt_logprobs_request_computes_its_cached_prompt_again() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add_request(request("warm", PROMPT, max_tokens=1))
    run_one_step(scheduler)
    scheduler.add_request(request("plain", PROMPT, max_tokens=1))
    plan = scheduler.schedule()
    assert plan is not None and plan.scheduled[0].cached_block_ids  # the prompt's blocks are cached
    scheduler.process_result(StepResult(plan.step_id, [plan.scheduled[0].slot], [7]))
    scheduler.add_request(request("scored", PROMPT, max_tokens=1, prompt_logprobs=0))
    plan = scheduler.schedule()
    assert plan is not None
    chunk = plan.scheduled[0]
    assert chunk.cached_block_ids == [] and chunk.num_computed_tokens == 0 and chunk.num_new_tokens == len(PROMPT)


def test_chunk_reports_go_out_once_in_order_with_the_first_token() -> None:
    scheduler = Scheduler(make_config(max_num_batched_tokens=8))
    scheduler.add_request(request("r", PROMPT, max_tokens=2, prompt_logprobs=0))
    scheduler.take_outputs()
    run_one_step(scheduler, [PromptLogprobs("r", 1, entries(1, 8))])  # tokens 0..7 computed: 1..7 scored
    assert scheduler.take_outputs() is None  # nothing sampled yet: the scores wait for the first token
    # A recomputation (after preemption) reports tokens 1..11 again; only 8..11 are new.
    run_one_step(scheduler, [PromptLogprobs("r", 1, entries(1, 12))])
    batch = scheduler.take_outputs()
    assert batch is not None
    [update] = batch.updates
    assert update.token_ids == [7]
    assert [entry.logprob for entry in update.prompt_logprobs] == [-float(i) for i in range(1, 12)]
    run_one_step(scheduler)
    batch = scheduler.take_outputs()
    assert batch is not None and batch.updates[0].prompt_logprobs == [] and batch.updates[0].finish_reason == "length"
