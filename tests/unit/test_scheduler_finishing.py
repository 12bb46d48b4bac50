"""How a request ends, driven by test_scheduler.py's fake worker: stop ids, EOS, max_tokens and max_model_len
give their finish reasons in lockstep and async modes (a token sampled after the finishing step is dropped), and
an abort, waiting or running or with two steps in flight, keeps what was produced and frees everything."""

from __future__ import annotations

import pytest

from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import (Event, FakeWorker, Outcome, check_every_slot_released, counting_model, drive,
                                       hashed_model, make_config, reference, request)


# ---- finishing ---------------------------------------------------------------------------------

FINISH_CASES = [
    # (prompt, params, tokens, finish_reason, stop_reason); the model counts up and EOS is 14
    ([10], dict(max_tokens=10), [11, 12, 13, 14], "stop", None),
    ([10], dict(max_tokens=10, ignore_eos=True), list(range(11, 21)), "length", None),
    ([10], dict(max_tokens=10, stop_token_ids=[13]), [11, 12, 13], "stop", 13),
    ([10], dict(max_tokens=10, stop_token_ids=[14]), [11, 12, 13, 14], "stop", 14),
    ([10], dict(max_tokens=10, ignore_eos=True, stop_token_ids=[16]), list(range(11, 17)), "stop", 16),
    ([10], dict(max_tokens=1), [11], "length", None),
    ([10], dict(max_tokens=3), [11, 12, 13], "length", None),
    (list(range(100, 160)), dict(max_tokens=None), [160, 161, 162, 163], "length", None),
    (list(range(100, 163)), dict(max_tokens=50), [163], "length", None),
]


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
@pytest.mark.parametrize(("prompt", "params", "tokens", "finish_reason", "stop_reason"), FINISH_CASES)
def test_finish_reasons(depth: int, prompt: list[int], params: dict, tokens: list[int], finish_reason: str,
                        stop_reason: int | None) -> None:
    config = make_config(eos_token_ids=(14,))
    run = drive(config, {0: [request("r", prompt, **params)]}, depth, model=counting_model)
    assert run.outcomes["r"] == Outcome(tokens, finish_reason, stop_reason)
    extra_steps = run.worker.num_sampled["r"] - len(tokens)
    # Limits are known up front, so only a stop seen one step late costs an extra (discarded) step.
    assert extra_steps == (1 if depth == 2 and finish_reason == "stop" else 0)


def test_token_sampled_after_the_finishing_step_is_discarded() -> None:
    config = make_config(eos_token_ids=(14,))
    events: dict[int, list[Event]] = {0: [request("r", [10], max_tokens=10, logprobs=1)]}
    run = drive(config, events, depth=2, model=counting_model)
    assert run.worker.num_sampled["r"] == 5
    assert run.outcomes["r"] == Outcome([11, 12, 13, 14], "stop", None)


# ---- aborts ------------------------------------------------------------------------------------


def test_abort_of_a_waiting_request() -> None:
    config = make_config(max_num_seqs=1)
    events: dict[int, list[Event]] = {0: [request("a", [1, 2], max_tokens=5, ignore_eos=True),
                                          request("b", [3, 4], max_tokens=5)], 2: ["b"]}
    run = drive(config, events, depth=2)
    assert run.outcomes["b"] == Outcome([], "abort", None)
    assert "b" not in run.admissions
    assert run.outcomes["a"] == reference(events[0][0], config, hashed_model)


@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
@pytest.mark.parametrize("abort_at", [1, 4, 9])
def test_abort_of_a_running_request_keeps_what_it_produced(depth: int, abort_at: int) -> None:
    config = make_config(max_num_batched_tokens=6)
    long = request("long", range(1, 12), max_tokens=30, ignore_eos=True)
    other = request("other", [5, 6], max_tokens=12, ignore_eos=True)
    run = drive(config, {0: [long, other], abort_at: ["long", "never-seen"]}, depth)
    produced = run.outcomes["long"]
    full = reference(long, config, hashed_model).token_ids
    assert produced.finish_reason == "abort"
    assert produced.token_ids == full[: len(produced.token_ids)]
    assert run.outcomes["other"] == reference(other, config, hashed_model)


def test_abort_while_two_steps_are_in_flight() -> None:
    config = make_config()
    scheduler, worker = Scheduler(config), FakeWorker(config, hashed_model)
    scheduler.add_request(request("r", [1, 2, 3], max_tokens=10, ignore_eos=True))
    first, second = scheduler.schedule(), scheduler.schedule()
    assert first is not None and second is not None and scheduler.num_inflight_steps == 2
    scheduler.abort_request("r")
    batch = scheduler.take_outputs()
    assert batch is not None and [(u.token_ids, u.finish_reason) for u in batch.updates] == [([], "abort")]
    scheduler.process_result(worker.execute(first))
    scheduler.process_result(worker.execute(second))
    assert scheduler.take_outputs() is None
    assert scheduler.stats().kv_blocks_used == 0 and not scheduler.has_unfinished_requests()
    scheduler.abort_request("r")
    scheduler.abort_request("unknown")
    assert scheduler.take_outputs() is None
    check_every_slot_released(scheduler, worker)
