"""Scheduler admission and failure handling: what it refuses, and how a worker-reported failure ends one request.

A client that bypasses the frontend (or a frontend bug) must not get anything past the scheduler
that the worker cannot represent; a full waiting queue refuses at once; a request the worker could
not serve ends alone, and requests that read its (never written) KV blocks are recomputed.
"""

from __future__ import annotations

import pytest

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import GenerateRequest, SlotFailure, StepResult
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.admission import RequestRejected
from rapid_llm.scheduler_proc.scheduler import Scheduler

VOCAB = 100


def scheduler(**overrides: object) -> Scheduler:
    config = dict(max_model_len=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=64, num_kv_blocks=64,
                  vocab_size=VOCAB)
    return Scheduler(SchedulerConfig(**{**config, **overrides}))


def request(request_id: str, prompt: list[int] | None = None, **params: object) -> GenerateRequest:
    return GenerateRequest(request_id, prompt or [1, 2, 3, 4, 5], SamplingParams(temperature=0.0, **params))


@pytest.mark.parametrize(
    "params",
    [
        {"seed": 2**64 - 1},
        {"seed": 2**63 - 1, "n": 2},
        {"top_k": 2**64 - 1},
        {"stop_token_ids": [2**64 - 1], "min_tokens": 2},
        {"stop_token_ids": [VOCAB]},
        {"logit_bias": {VOCAB: 1.0}},
        {"max_tokens": 0},
    ],
)
def test_parameters_the_worker_cannot_take_are_refused_as_invalid(params: dict[str, object]) -> None:
    sched = scheduler()
    with pytest.raises(RequestRejected) as error:
        sched.add_request(request("bad", **params))
    assert error.value.kind == "invalid_request"
    assert "request bad" in str(error.value)
    assert not sched.has_unfinished_requests()


@pytest.mark.parametrize("prompt", [[1, VOCAB], [-1, 2]])
def test_prompt_ids_outside_the_vocabulary_are_refused(prompt: list[int]) -> None:
    with pytest.raises(RequestRejected, match="prompt token ids"):
        scheduler().add_request(request("bad", prompt))


def test_a_duplicate_id_is_not_a_rejection() -> None:
    # The process loop ends a rejected request under its id; for a duplicate that would end the live one.
    sched = scheduler()
    sched.add_request(request("a"))
    with pytest.raises(ValueError, match="already in use") as error:
        sched.add_request(request("a"))
    assert not isinstance(error.value, RequestRejected)


def test_a_full_waiting_queue_refuses_new_requests_until_it_drains() -> None:
    sched = scheduler(max_waiting_requests=2)
    sched.add_request(request("a"))
    sched.add_request(request("b"))
    with pytest.raises(RequestRejected) as error:
        sched.add_request(request("c"))
    assert error.value.kind == "queue_full"
    assert sched.stats().num_waiting == 2
    sched.schedule()  # admits both: the queue is empty again
    sched.add_request(request("c"))
    assert sched.stats().num_waiting == 1


def test_a_waiting_queue_is_unbounded_by_default() -> None:
    sched = scheduler()
    for index in range(50):
        sched.add_request(request(str(index)))
    assert sched.stats().num_waiting == 50


def test_a_failed_request_ends_alone_with_its_error_and_readers_of_its_blocks_are_recomputed() -> None:
    sched = scheduler()
    shared_prompt = list(range(1, 10))  # two full blocks that the second request finds cached
    sched.add_request(request("failing", shared_prompt))
    sched.add_request(request("reader", shared_prompt))
    sched.add_request(request("other", [7, 8, 9]))
    plan = sched.schedule()
    slot = {new.request_id: new.slot for new in plan.new_requests}
    reader_chunk = next(chunk for chunk in plan.scheduled if chunk.slot == slot["reader"])
    assert reader_chunk.cached_block_ids, "the reader should share the failing request's prompt blocks"
    sched.process_result(StepResult(
        plan.step_id, slots=[slot["reader"], slot["other"]], token_ids=[11, 12],
        failures=[SlotFailure(slot["failing"], "failing", "ValueError: boom")],
    ))
    updates = {update.request_id: update for update in sched.take_outputs().updates}
    assert updates["failing"].finish_reason == "abort"
    assert (updates["failing"].error, updates["failing"].error_kind) == ("ValueError: boom", "internal")
    assert "reader" not in updates, "the reader's token was computed from unwritten KV and must be dropped"
    assert updates["other"].token_ids == [12] and updates["other"].error is None
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_steps) == (1, 1, 1)
    # The reader comes back recomputing its whole prompt: the suspect blocks left the prefix cache.
    replan = sched.schedule()
    resumed = next(new for new in replan.new_requests if new.request_id == "reader")
    chunk = next(chunk for chunk in replan.scheduled if chunk.slot == resumed.slot)
    assert (chunk.num_computed_tokens, chunk.cached_block_ids) == (0, [])


def test_no_request_copies_a_block_before_its_writing_step_reports() -> None:
    """Radix partial hits copy a block at the start of a step: a block whose writing step (still in flight, async
    scheduling) fails must never have been copied, since its copy would not be found among the failure's readers."""
    sched = scheduler(prefix_cache_policy="radix")
    sched.add_request(request("failing", list(range(1, 10))))
    first = sched.schedule()
    sched.add_request(request("copier", [1, 2, 3, 4, 5, 6, 40, 41]))  # leaves the failing prompt inside block 2
    second = sched.schedule()  # planned while the first step runs
    assert second.block_copies == [], "the first step has not reported: nothing it writes may be copied yet"
    slot = {new.request_id: new.slot for new in first.new_requests}
    sched.process_result(StepResult(first.step_id, slots=[], token_ids=[],
                                    failures=[SlotFailure(slot["failing"], "failing", "ValueError: boom")]))
    sched.add_request(request("later", [1, 2, 3, 4, 5, 6, 50, 51]))
    third = sched.schedule()
    failed_blocks = {block for chunk in first.scheduled for block in chunk.new_block_ids}
    reused = {block for chunk in third.scheduled for block in chunk.cached_block_ids}
    assert third.block_copies == [] and not reused & failed_blocks, "the failed step's blocks left the cache"
