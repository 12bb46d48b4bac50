"""A GenerateBatch (the offline LLM's prompts) is admitted in one drain: the first plan holds every request,
however the sends are timed; single GenerateRequests keep working beside it."""

from __future__ import annotations

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import GenerateBatch, GenerateRequest, StepPlan
from rapid_llm.sampling import SamplingParams
from tests.unit.scheduler_loop_harness import scheduler_loop


def test_a_batch_is_planned_in_one_step() -> None:
    config = SchedulerConfig(max_model_len=32, block_size=4)
    params = SamplingParams(max_tokens=2)
    with scheduler_loop(config) as loop:
        loop.requests.send(GenerateBatch([GenerateRequest(f"r{i}", [1, 2, 3 + i], params) for i in range(3)]))
        assert loop.plans.socket.poll(10_000), "the scheduler sent no plan"
        plan = loop.plans.recv()
        assert isinstance(plan, StepPlan)
        assert [request.request_id for request in plan.new_requests] == ["r0", "r1", "r2"]
        assert [chunk.num_new_tokens for chunk in plan.scheduled] == [3, 3, 3]
        loop.stop()
        assert loop.stopped
