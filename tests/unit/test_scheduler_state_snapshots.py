"""State snapshots in the scheduler (scheduler_proc/state_snapshots.py), driven by test_scheduler.py's fake worker:
a model with state layers keeps the state at a prompt's last block boundary and every interval inside its chunks
(no chunk is cut), a repeated or prefix-sharing prompt starts from the latest kept state it shares, a snapshot is
usable only once its step's result is in, and without snapshots such a model never hits."""

from __future__ import annotations

import pytest

from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import FakeWorker, make_config, request
from tests.unit.test_scheduler_prefix_cache import first_chunk, run_until_idle

PROMPT = list(range(4, 14))  # 10 tokens: two full blocks of 4, then 2


def test_a_prompt_keeps_the_state_at_its_last_block_boundary_and_a_repeat_starts_from_it() -> None:
    config = make_config(recurrent_state=True, state_snapshots=4)
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    scheduler.add_request(request("first", PROMPT, max_tokens=2, ignore_eos=True))
    plans = run_until_idle(scheduler, worker)
    first = plans[0].scheduled[0]
    # One chunk (no cut): the state after token 8, inside it, is kept for a repeat.
    assert (first.num_computed_tokens, first.num_new_tokens) == (0, 10)
    assert len(first.state_saves) == 1 and first.state_saves[0][0] == 8 and first.state_load == -1
    scheduler.add_request(request("again", PROMPT, max_tokens=2, ignore_eos=True))
    hit = first_chunk(run_until_idle(scheduler, worker), "again")
    assert (hit.num_computed_tokens, len(hit.cached_block_ids), hit.state_load) == (8, 2, first.state_saves[0][1])
    assert scheduler.stats().prefix_cache_hits == 8


@pytest.mark.parametrize("interval", [16, 5])
def test_a_long_prompt_keeps_states_every_interval_for_the_prefixes_it_shares(interval: int) -> None:
    config = make_config(recurrent_state=True, state_snapshots=64, max_model_len=256, block_size=4,
                         state_snapshot_interval=interval)
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    shared = list(range(4, 4 + 150))
    scheduler.add_request(request("first", shared + [7, 8, 9], max_tokens=1))
    first = run_until_idle(scheduler, worker)[0].scheduled[0]
    stride = interval * 4
    assert [position for position, _ in first.state_saves] == [*range(stride, 153, stride), 152]
    scheduler.add_request(request("other", shared + [11, 12, 13, 14], max_tokens=1))
    hit = first_chunk(run_until_idle(scheduler, worker), "other")
    assert hit.num_computed_tokens == 150 // stride * stride  # the last kept state inside the shared prefix


def test_a_snapshot_is_used_only_once_the_step_that_saves_it_has_reported() -> None:
    config = make_config(recurrent_state=True, state_snapshots=4, max_num_batched_tokens=8)
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    scheduler.add_request(request("first", PROMPT, max_tokens=1))
    saving = scheduler.schedule()
    assert saving is not None and saving.scheduled[0].state_saves
    scheduler.add_request(request("twin", PROMPT, max_tokens=1))
    planned_before = scheduler.schedule()  # its blocks are cached, but the state after them is not saved yet
    assert planned_before is not None
    twin = first_chunk([planned_before], "twin")
    assert (twin.num_computed_tokens, twin.state_load) == (0, -1)


def test_without_snapshots_a_model_with_state_never_hits() -> None:
    config = make_config(recurrent_state=True, state_snapshots=0)
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    for name in ("first", "again"):
        scheduler.add_request(request(name, PROMPT, max_tokens=1))
        chunks = [chunk for plan in run_until_idle(scheduler, worker) for chunk in plan.scheduled]
        assert all(not chunk.state_saves and chunk.state_load == -1 for chunk in chunks)
    assert scheduler.stats().prefix_cache_hits == 0
