"""Prefix caching in the scheduler (scheduler_proc/prefix_cache.py), driven by test_scheduler.py's fake worker:
repeated prompts reuse full blocks yet compute at least one token, output blocks are cached once their ids are
known, caching off never reuses, a preempted request resumes from its own cached blocks, and a flush forgets
every block but is refused while requests are unfinished."""

from __future__ import annotations

import itertools
from collections import deque

import pytest

from rapid_llm.ipc.messages import ScheduledChunk, StepPlan
from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import (Event, FakeWorker, counting_model, drive, expected_outcomes, hashed_model,
                                      make_config, random_workload, request)


def run_until_idle(scheduler: Scheduler, worker: FakeWorker, depth: int = 1) -> list[StepPlan]:
    """Plan and execute until nothing is left to schedule; the plans made."""
    plans: list[StepPlan] = []
    sent: deque[StepPlan] = deque()
    while True:
        while scheduler.num_inflight_steps < depth and (plan := scheduler.schedule()) is not None:
            sent.append(plan)
            plans.append(plan)
        if not sent:
            return plans
        scheduler.process_result(worker.execute(sent.popleft()))


def first_chunk(plans: list[StepPlan], request_id: str) -> ScheduledChunk:
    """The chunk that started `request_id` (its latest admission)."""
    for plan in reversed(plans):
        for new in plan.new_requests:
            if new.request_id == request_id:
                return next(chunk for chunk in plan.scheduled if chunk.slot == new.slot)
    raise AssertionError(f"{request_id} was never admitted")


def cached_tokens_reported(scheduler: Scheduler) -> dict[str, int]:
    batch = scheduler.take_outputs()
    assert batch is not None
    return {update.request_id: update.num_cached_tokens for update in batch.updates}


@pytest.mark.parametrize("policy", ["hash", "radix"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_a_repeated_prompt_reuses_full_blocks_but_computes_at_least_one_token(depth: int, policy: str) -> None:
    config = make_config(block_size=4, prefix_cache_policy=policy)
    scheduler, worker = Scheduler(config), FakeWorker(config, hashed_model)
    prompt = list(range(1, 9))  # exactly 2 blocks
    scheduler.add_request(request("first", prompt, max_tokens=1))
    run_until_idle(scheduler, worker, depth)
    assert cached_tokens_reported(scheduler) == {"first": 0}
    first_blocks = worker.plans[0].scheduled[0].new_block_ids

    # The last block is written, so not shared: hash recomputes it; radix copies its first 3 tokens.
    scheduler.add_request(request("same", prompt, max_tokens=3))
    scheduler.add_request(request("longer", prompt + [9], max_tokens=3))  # only its 9th token is computed
    scheduler.add_request(request("other", [5, *prompt[1:]], max_tokens=3))  # differs in block 0: no hit
    plans = run_until_idle(scheduler, worker, depth)
    same, longer, other = (first_chunk(plans, rid) for rid in ("same", "longer", "other"))
    num_same = 7 if policy == "radix" else 4
    assert (same.cached_block_ids[:1], same.num_computed_tokens, same.num_new_tokens) == (first_blocks[:1], num_same,
                                                                                           8 - num_same)
    copies = [copy for plan in plans for copy in plan.block_copies]
    if policy == "radix":
        assert [(copy.src, copy.dst) for copy in copies] == [(first_blocks[1], same.cached_block_ids[1])]
    else:
        assert same.cached_block_ids == first_blocks[:1] and copies == []
    assert (longer.cached_block_ids, longer.num_computed_tokens, longer.num_new_tokens) == (first_blocks, 8, 1)
    assert (other.cached_block_ids, other.num_computed_tokens) == ([], 0)
    assert cached_tokens_reported(scheduler) == {"same": num_same, "longer": 8, "other": 0}
    stats = scheduler.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (8 + 8 + 9 + 8, num_same + 8)
    assert stats.kv_blocks_used == 0 and scheduler._blocks.num_free_blocks == config.num_kv_blocks


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_blocks_of_output_tokens_are_cached_once_their_ids_are_known(depth: int) -> None:
    config = make_config(block_size=4)
    scheduler, worker = Scheduler(config), FakeWorker(config, counting_model)
    scheduler.add_request(request("a", [1, 2, 3], max_tokens=6, ignore_eos=True))
    run_until_idle(scheduler, worker, depth)
    # a's KV holds 1..8 (its last output, 9, is never computed): two full blocks.
    scheduler.add_request(request("b", list(range(1, 11)), max_tokens=1, ignore_eos=True))
    chunk = first_chunk(run_until_idle(scheduler, worker, depth), "b")
    assert (chunk.num_computed_tokens, len(chunk.cached_block_ids)) == (8, 2)


def test_caching_off_never_reuses() -> None:
    config = make_config(block_size=4, enable_prefix_caching=False)
    scheduler, worker = Scheduler(config), FakeWorker(config, hashed_model)
    for request_id in ("a", "b"):
        scheduler.add_request(request(request_id, range(1, 12), max_tokens=2))
        chunk = first_chunk(run_until_idle(scheduler, worker), request_id)
        assert (chunk.cached_block_ids, chunk.num_computed_tokens) == ([], 0)
    assert cached_tokens_reported(scheduler) == {"a": 0, "b": 0}
    stats = scheduler.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (0, 0)


def test_a_preempted_request_resumes_from_its_own_cached_blocks() -> None:
    config = make_config(max_model_len=16, num_kv_blocks=4, max_num_seqs=2)
    events: dict[int, list[Event]] = {0: [
        request("a", range(10, 18), max_tokens=2, ignore_eos=True),
        request("b", range(30, 37), max_tokens=4, ignore_eos=True),
    ]}
    run = drive(config, events, depth=1, model=counting_model)
    assert run.admissions == ["a", "b", "b"]
    b_first = first_chunk(run.worker.plans[:1], "b")
    resumed = first_chunk(run.worker.plans, "b")
    # b's first block (30..33) was full and survived; its partial second block went to a.
    assert resumed.cached_block_ids == b_first.new_block_ids[:1] and resumed.num_computed_tokens == 4
    assert run.outcomes == expected_outcomes(events, config, counting_model)


def test_flush_is_refused_while_requests_are_unfinished_and_forgets_every_block() -> None:
    config = make_config(block_size=4)
    scheduler, worker = Scheduler(config), FakeWorker(config, hashed_model)
    scheduler.add_request(request("a", range(1, 12), max_tokens=2))
    assert scheduler.reset_prefix_cache() is False
    run_until_idle(scheduler, worker)
    assert scheduler.reset_prefix_cache() is True
    scheduler.add_request(request("b", range(1, 12), max_tokens=2))
    assert scheduler.reset_prefix_cache() is False, "a waiting request also counts"
    chunk = first_chunk(run_until_idle(scheduler, worker), "b")
    assert (chunk.cached_block_ids, chunk.num_computed_tokens) == ([], 0)


@pytest.mark.parametrize("policy", ["hash", "radix"])
def test_the_offload_tier_gives_back_evicted_prefixes_exactly(policy: str) -> None:
    """A cache of 16 blocks under a workload that evicts, with a tier of 2 or 3 slots (so that one plan saves into
    slots it also loads), lockstep and async, chunked or not: every output is the reference's, and the tier is both
    written and read."""
    loads = 0
    for seed, slots, depth, budget in itertools.product(range(3), (2, 3), (1, 2), (5, 256)):
        config = make_config(num_kv_blocks=16, prefix_cache_policy=policy, kv_offload_slots=slots,
                             max_num_batched_tokens=budget)
        events = random_workload(seed)
        run = drive(config, events, depth)
        assert run.outcomes == expected_outcomes(events, config)
        loads += sum(len(plan.tier_loads) for plan in run.worker.plans)
    assert loads > 0
