"""Step policies (scheduler_proc/step_policy.py): a new request lifecycle without touching the scheduler loop.

The test policy holds a request after its prompt, as a prefill instance would hand a request's KV to a decode
instance in prefill/decode disaggregation, until the test releases it. The real Scheduler runs against the
faithful fake worker of test_scheduler.py: the held request gets its first token, then no step until released,
while the other request runs to its end; every output equals the reference.
"""

from __future__ import annotations

from collections import deque

import pytest

from rapid_llm.ipc.messages import GenerateRequest, StepPlan
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.scheduler_proc.scheduler import Scheduler, _PlanDraft
from rapid_llm.scheduler_proc.step_policy import PLAIN, StepAsk, StepPolicy
from tests.unit.test_scheduler import FakeWorker, _Collector, expected_outcomes, hashed_model, make_config, request


class HoldAfterPrompt(StepPolicy):
    """Plain decoding, except that a request in `held` gets no step once its prompt is computed."""

    def __init__(self) -> None:
        self.held: set[str] = set()

    def ask(self, scheduler: Scheduler, request: RequestState, draft: _PlanDraft) -> StepAsk | None:
        if request.request_id in self.held and request.num_computed_tokens >= request.num_prompt_tokens:
            return None
        return super().ask(scheduler, request, draft)


class HoldingScheduler(Scheduler):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.hold = HoldAfterPrompt()

    def policy_for(self, request: RequestState) -> StepPolicy:
        return self.hold if request.request_id.startswith("held") else super().policy_for(request)


def events() -> list[GenerateRequest]:
    return [request("held", list(range(1, 19)), max_tokens=6, ignore_eos=True),
            request("other", list(range(30, 41)), max_tokens=12, ignore_eos=True)]


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_a_held_request_waits_after_its_prompt_and_finishes_once_released(depth: int) -> None:
    config = make_config(max_num_batched_tokens=8)
    scheduler, worker, collector = HoldingScheduler(config), FakeWorker(config, hashed_model), _Collector()
    assert scheduler.policy_for(RequestState(events()[1], config.max_model_len, config.block_size)) is PLAIN
    scheduler.hold.held.add("held")
    for event in events():
        scheduler.add_request(event)
        collector.params[event.request_id] = event.params
    sent: deque[StepPlan] = deque()
    released_at = None
    for iteration in range(500):
        while scheduler.num_inflight_steps < depth and (plan := scheduler.schedule()) is not None:
            sent.append(plan)
        collector.add(scheduler.take_outputs())
        if sent:
            scheduler.process_result(worker.execute(sent.popleft()))
        elif not scheduler.has_unfinished_requests():
            break
        outcomes = collector.outcomes
        if released_at is None and outcomes.get("other") and outcomes["other"].finish_reason is not None:
            # Held all along: its prompt's chunk sampled one token, and nothing was scheduled for it since.
            assert len(outcomes["held"].token_ids) == 1 and outcomes["held"].finish_reason is None
            scheduler.hold.held.clear()
            released_at = len(worker.plans)
    collector.add(scheduler.take_outputs())
    assert released_at is not None
    held_slot = next(new.slot for plan in worker.plans for new in plan.new_requests if new.request_id == "held")
    steps_with_held = [i for i, plan in enumerate(worker.plans) if any(c.slot == held_slot for c in plan.scheduled)]
    # Its 18-token prompt takes at most 3 steps of 8 tokens; every later step of it was planned after the release
    # (a plan made at most `depth` steps before the step that follows it).
    assert all(i >= released_at - depth for i in steps_with_held[3:])
    assert collector.outcomes == expected_outcomes({0: events()}, config, hashed_model)
