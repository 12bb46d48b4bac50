"""The scheduler with pipeline stages (`pipeline_parallel_size`): the plans in flight are micro-batches of other
requests (a request whose sampled token is not back waits; a plan takes at most an even share of the running
requests), and every mode still gives the reference outputs (the harness of test_scheduler.py)."""

from __future__ import annotations

import pytest

from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import FakeWorker, drive, expected_outcomes, hashed_model, make_config, random_workload
from tests.unit.test_scheduler import request as make_request


@pytest.mark.parametrize("depth", [2, 3], ids=["lockstep", "async"])
@pytest.mark.parametrize(("budget", "num_kv_blocks"), [(5, 16), (256, 200)], ids=["tiny", "large"])
@pytest.mark.parametrize("seed", [0, 1])
def test_micro_batches_give_the_reference_outputs(depth: int, budget: int, num_kv_blocks: int, seed: int) -> None:
    config = make_config(max_num_batched_tokens=budget, num_kv_blocks=num_kv_blocks, pipeline_parallel_size=2)
    events = random_workload(seed)
    assert drive(config, events, depth).outcomes == expected_outcomes(events, config)


def test_plans_in_flight_hold_other_requests() -> None:
    config = make_config(pipeline_parallel_size=2)
    scheduler, worker = Scheduler(config), FakeWorker(config, hashed_model)
    for index in range(4):
        scheduler.add_request(make_request(f"r{index}", [5, 6, 7], max_tokens=6, ignore_eos=True))
    prefill = scheduler.schedule()
    assert prefill is not None and len(prefill.scheduled) == 4
    assert scheduler.schedule() is None  # every request waits for its first token
    scheduler.process_result(worker.execute(prefill))
    first, second = scheduler.schedule(), scheduler.schedule()
    assert first is not None and second is not None and scheduler.schedule() is None
    slots = [{chunk.slot for chunk in plan.scheduled} for plan in (first, second)]
    assert len(slots[0]) == len(slots[1]) == 2 and not slots[0] & slots[1]
    scheduler.process_result(worker.execute(first))
    third = scheduler.schedule()  # the first micro-batch's requests are back: they go again
    assert third is not None and {chunk.slot for chunk in third.scheduled} == slots[0]
