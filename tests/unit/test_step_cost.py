"""The step cost model and its two cuts on prompt chunks (scheduler_proc/step_cost.py).

The scheduler tests drive the real Scheduler against the faithful fake worker of test_scheduler.py, whose
steps report a synthetic time computed from what they ran (or no time, so the model never fits: the cuts are
off): greedy outputs must equal the reference either way; with the cuts a burst of long prompts ends one
prompt per step, and with the ITL target a prompt arriving beside decodes is cut to fit the target.
"""

from __future__ import annotations

import random
from collections import deque

import msgspec
import pytest

from rapid_llm.ipc.messages import GenerateRequest, StepPlan, StepResult
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.scheduler_proc.step_cost import (MIN_PREFILL_CHUNK, PACKING_RATIO, PrefillAllowance,
                                                StepCostModel, attention_pairs, step_features)
from tests.unit.test_scheduler import FakeWorker, _Collector, expected_outcomes, hashed_model, make_config, request

CONSTANT, PER_TOKEN, PER_PAIR = 1e-3, 3e-5, 6e-9


def synthetic_seconds(features: tuple[int, int]) -> float:
    tokens, pairs = features
    return CONSTANT + PER_TOKEN * tokens + PER_PAIR * pairs


def observed_model(rng: random.Random, steps: int = 120, noise: float = 0.0) -> StepCostModel:
    """A model fed decode batches and, every tenth step, a 512-token chunk after some context."""
    model = StepCostModel()
    for index in range(steps):
        if index % 10 == 0:
            features = step_features([(rng.randrange(0, 4000), 512)])
        else:
            features = step_features([(rng.randrange(100, 4000), 1) for _ in range(rng.randint(1, 8))])
        model.observe(features, synthetic_seconds(features) * rng.uniform(1 - noise, 1 + noise))
    return model


def test_features_count_the_causal_pairs() -> None:
    assert attention_pairs(0, 3) == 6  # 1 + 2 + 3 keys
    assert attention_pairs(10, 1) == 11
    assert step_features([(0, 3), (10, 1)]) == (4, 17)


def test_the_fit_recovers_the_costs_of_steps() -> None:
    model = observed_model(random.Random(0))
    for features in [(1, 500), (2048, attention_pairs(6000, 2048)), (8, 8 * 3000)]:
        assert model.predict(features) == pytest.approx(synthetic_seconds(features), rel=1e-3)


def test_the_fit_keeps_every_coefficient_non_negative() -> None:
    model = StepCostModel()
    # Bigger steps measured faster (noise): an unconstrained fit would give a negative per-token cost.
    for tokens, seconds in [(1, 0.010), (512, 0.009), (2, 0.011), (1024, 0.008)] * 5:
        model.observe((tokens, attention_pairs(0, tokens)), seconds)
    assert model.ready
    assert all(value >= 0 for value in model._fitted())
    assert model.predict((4096, 0)) >= model.predict((0, 0)) > 0


def test_max_new_tokens_is_the_longest_chunk_that_fits() -> None:
    model = observed_model(random.Random(1), noise=0.05)
    for context, seconds in [(0, 0.01), (3000, 0.05), (7000, 0.2)]:
        fits = model.max_new_tokens(context, seconds)
        assert fits > 0
        assert model.chunk_seconds(context, fits) <= seconds < model.chunk_seconds(context, fits + 1)
    assert model.max_new_tokens(0, 0.0) == 0


def test_no_allowance_before_a_prompt_sized_step_and_no_itl_cut_without_target_or_decodes() -> None:
    decodes_only = StepCostModel()
    decodes_only.observe((1, 100), 0.002)
    assert PrefillAllowance.start(decodes_only, 0.01, [(100, 1)]) is None
    model = observed_model(random.Random(2))
    for target, decodes in [(None, [(100, 1)]), (0.001, [])]:
        allowance = PrefillAllowance.start(model, target, decodes)
        assert allowance is not None and allowance.cap(0, 2048) == 2048


def test_a_long_step_where_a_prompt_ends_takes_no_other_prompt() -> None:
    model = observed_model(random.Random(6))
    allowance = PrefillAllowance.start(model, None, [])
    # A 20-token prompt costs less than PACKING_RATIO times the step's constant: others still join.
    assert model.chunk_seconds(0, 20) < PACKING_RATIO * model.predict((0, 0))
    allowance.count(0, 20, ends_prompt=True)
    assert allowance.cap(0, 1000) == 1000
    allowance.count(0, 1000, ends_prompt=False)  # a chunk that does not end its prompt: others still join
    assert allowance.cap(0, 1000) == 1000
    allowance.count(0, 1000, ends_prompt=True)
    assert allowance.cap(0, 1000) == 0


def test_the_first_chunk_always_progresses_and_later_ones_wait() -> None:
    model = observed_model(random.Random(3))
    # Decodes alone are predicted past the target: the step's first prompt chunk still gets the floor.
    allowance = PrefillAllowance.start(model, 0.004, [(4000, 1)] * 8)
    assert allowance is not None
    assert allowance.cap(0, 2048) == MIN_PREFILL_CHUNK
    assert allowance.cap(0, 20) == 20  # a prompt's short tail is taken whole
    allowance.count(0, MIN_PREFILL_CHUNK, ends_prompt=False)
    assert allowance.cap(0, 2048) == 0


def test_chunks_share_what_is_left_of_the_target() -> None:
    model = observed_model(random.Random(4))
    decodes = [(1000, 1)] * 2
    allowance = PrefillAllowance.start(model, 0.02, decodes)
    first = allowance.cap(500, 2048)
    allowance.count(500, first, ends_prompt=False)
    second = allowance.cap(0, 2048)
    assert MIN_PREFILL_CHUNK <= first < 2048 and second < first
    step = step_features([*decodes, (500, first), (0, second)])
    assert synthetic_seconds(step) == pytest.approx(0.02, rel=0.02)


class TimedWorker(FakeWorker):
    """The faithful fake worker, reporting a step time computed from the step's chunks."""

    def execute(self, plan: StepPlan) -> StepResult:
        result = super().execute(plan)
        seconds = synthetic_seconds(step_features((c.num_computed_tokens, c.num_new_tokens) for c in plan.scheduled))
        return msgspec.structs.replace(result, step_seconds=seconds)


def long_prompt_events() -> dict[int, list[GenerateRequest]]:
    """One request decoding (its 600-token prompt prefilled alone first), then a long and a short prompt."""
    rng = random.Random(5)
    return {
        0: [request("first", [rng.randrange(24) for _ in range(600)], max_tokens=60, ignore_eos=True)],
        4: [request("long", [rng.randrange(24) for _ in range(900)], max_tokens=8, ignore_eos=True),
            request("short", [rng.randrange(24) for _ in range(40)], max_tokens=8, ignore_eos=True)],
    }


def burst_events() -> dict[int, list[GenerateRequest]]:
    """A warm-up request (a prompt-sized step to fit the model on), then three 1000-token prompts at once."""
    rng = random.Random(7)
    return {
        0: [request("warm-up", [rng.randrange(24) for _ in range(600)], max_tokens=2, ignore_eos=True)],
        6: [request(f"burst{i}", [rng.randrange(24) for _ in range(1000)], max_tokens=4, ignore_eos=True)
            for i in range(3)],
    }


def drive_timed(events: dict[int, list[GenerateRequest]], depth: int, itl_target_ms: float | None = None,
                timed: bool = True) -> FakeWorker:
    """Drive the scheduler with `depth` plans in flight (steps timed, or reporting no time: the cost model then
    never fits); the outputs must equal the reference."""
    config = make_config(max_model_len=1024, block_size=16, max_num_seqs=4, max_num_batched_tokens=2048,
                         num_kv_blocks=300, itl_target_ms=itl_target_ms)
    expected = expected_outcomes(events, config, hashed_model)
    worker = (TimedWorker if timed else FakeWorker)(config, hashed_model)
    scheduler, collector, events = Scheduler(config), _Collector(), dict(events)
    sent: deque[StepPlan] = deque()
    for iteration in range(2000):
        for event in events.pop(iteration, []):
            scheduler.add_request(event)
            collector.params[event.request_id] = event.params
        while scheduler.num_inflight_steps < depth and (plan := scheduler.schedule()) is not None:
            sent.append(plan)
        collector.add(scheduler.take_outputs())
        if sent:
            scheduler.process_result(worker.execute(sent.popleft()))
        elif not events and not scheduler.has_unfinished_requests():
            break
    assert collector.outcomes == expected
    return worker


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_a_burst_of_long_prompts_ends_one_prompt_per_step_and_keeps_outputs(depth: int) -> None:
    def most_prompts_ended_in_a_step(worker: FakeWorker) -> int:
        return max(sum(c.num_new_tokens >= 500 and c.num_computed_tokens + c.num_new_tokens == 1000
                       for c in plan.scheduled) for plan in worker.plans)

    assert most_prompts_ended_in_a_step(drive_timed(burst_events(), depth)) == 1
    assert most_prompts_ended_in_a_step(drive_timed(burst_events(), depth, timed=False)) == 2


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_the_target_cuts_a_prompt_arriving_beside_decodes_and_keeps_outputs(depth: int) -> None:
    target_ms = 8.0
    worker_on = drive_timed(long_prompt_events(), depth, itl_target_ms=target_ms)
    worker_off = drive_timed(long_prompt_events(), depth)

    def mixed_steps(worker: FakeWorker) -> list[tuple[float, int]]:
        """(synthetic seconds, prompt tokens) of every step with both a decode and a prompt chunk."""
        steps = []
        for plan in worker.plans:
            prompt = [c.num_new_tokens for c in plan.scheduled if c.num_new_tokens > 1]
            if prompt and len(prompt) < len(plan.scheduled):
                features = step_features((c.num_computed_tokens, c.num_new_tokens) for c in plan.scheduled)
                steps.append((synthetic_seconds(features), sum(prompt)))
        return steps

    off, on = mixed_steps(worker_off), mixed_steps(worker_on)
    assert max(seconds for seconds, _ in off) > 2 * target_ms / 1000, "the run must stall decodes without a target"
    assert on and all(seconds <= target_ms / 1000 * 1.01 or prompt == MIN_PREFILL_CHUNK for seconds, prompt in on)
    # The long prompt arrived beside a decode, so with the target it took more, smaller chunks.
    assert len(on) > len(off)
