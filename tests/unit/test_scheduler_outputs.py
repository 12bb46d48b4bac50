"""What the scheduler reports, driven by test_scheduler.py's fake worker: each request is announced once before
its updates, each token as soon as its result is processed, queue and prefill times with the first token, and
stats that count queues and blocks."""

from __future__ import annotations

import time

import pytest

from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import FakeWorker, counting_model, make_config, request


def test_outputs_announce_each_request_once_before_its_updates() -> None:
    scheduler = Scheduler(make_config())
    assert scheduler.take_outputs() is None
    scheduler.add_request(request("r", [1, 2], stop=["x"], skip_special_tokens=False))
    batch = scheduler.take_outputs()
    assert batch is not None and batch.updates == []
    [announced] = batch.new_requests
    assert (announced.request_id, announced.prompt_token_ids, announced.stop, announced.skip_special_tokens) == (
        "r", [1, 2], ["x"], False)
    assert scheduler.take_outputs() is None


def test_each_token_is_reported_as_soon_as_its_result_is_processed() -> None:
    config = make_config()
    scheduler, worker = Scheduler(config), FakeWorker(config, counting_model)
    scheduler.add_request(request("r", [10], max_tokens=3, ignore_eos=True))
    scheduler.take_outputs()
    updates = []
    while (plan := scheduler.schedule()) is not None:
        scheduler.process_result(worker.execute(plan))
        batch = scheduler.take_outputs()
        assert batch is not None
        updates += [(u.token_ids, u.finish_reason, u.num_prompt_tokens) for u in batch.updates]
    assert updates == [([11], None, 1), ([12], None, 1), ([13], "length", 1)]


def test_queue_and_prefill_times_come_from_admission_and_first_token(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    config = make_config(max_num_seqs=1)
    scheduler, worker = Scheduler(config), FakeWorker(config, counting_model)
    scheduler.add_request(request("a", [10], max_tokens=2, ignore_eos=True))
    scheduler.add_request(request("b", [20], max_tokens=1, ignore_eos=True))
    timings = []
    for step_ends in (101.0, 103.0, 106.0):  # a's two tokens, then b's one; each step takes a second
        now[0] = step_ends - 1.0
        plan = scheduler.schedule()
        assert plan is not None
        now[0] = step_ends
        scheduler.process_result(worker.execute(plan))
        batch = scheduler.take_outputs()
        assert batch is not None
        timings += [(u.request_id, u.queue_time, u.prefill_time) for u in batch.updates]
    # b arrived at 100, was admitted at 105 (after a finished), sampled at 106.
    assert timings == [("a", 0.0, 1.0), ("a", None, None), ("b", 5.0, 1.0)]


def test_stats_count_queues_and_blocks() -> None:
    scheduler = Scheduler(make_config(max_num_seqs=1))
    scheduler.add_request(request("a", range(9)))
    scheduler.add_request(request("b", [1]))
    scheduler.schedule()
    stats = scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used, stats.kv_blocks_total) == (1, 1, 3, 200)
