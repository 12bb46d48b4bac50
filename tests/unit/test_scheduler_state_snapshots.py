"""State snapshots in the scheduler (scheduler_proc/state_snapshots.py), driven by test_scheduler.py's fake worker:
a model with state layers cuts a prompt's chunk at its last block boundary and saves the state there, a repeated
prompt starts from that snapshot with the blocks before it, a snapshot is usable only once its step's result is in,
and without snapshots such a model never hits."""

from __future__ import annotations

from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import FakeWorker, make_config, request
from tests.unit.test_scheduler_prefix_cache import first_chunk, run_until_idle

PROMPT = list(range(4, 14))  # 10 tokens: two full blocks of 4, then 2


def test_a_prompt_is_cut_at_its_last_block_boundary_and_a_repeat_starts_from_the_snapshot() -> None:
    config = make_config(recurrent_state=True, state_snapshots=4)
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    scheduler.add_request(request("first", PROMPT, max_tokens=2, ignore_eos=True))
    plans = run_until_idle(scheduler, worker)
    chunks = [chunk for plan in plans for chunk in plan.scheduled]
    # One more step than the budget needs: [0, 8) keeps the state at the boundary, [8, 10) samples.
    assert [(c.num_computed_tokens, c.num_new_tokens) for c in chunks[:2]] == [(0, 8), (8, 2)]
    assert chunks[0].state_save >= 0 and chunks[1].state_save == -1 and chunks[0].state_load == -1
    scheduler.add_request(request("again", PROMPT, max_tokens=2, ignore_eos=True))
    hit = first_chunk(run_until_idle(scheduler, worker), "again")
    assert (hit.num_computed_tokens, len(hit.cached_block_ids), hit.state_load) == (8, 2, chunks[0].state_save)
    assert scheduler.stats().prefix_cache_hits == 8


def test_a_snapshot_is_used_only_once_the_step_that_saves_it_has_reported() -> None:
    config = make_config(recurrent_state=True, state_snapshots=4, max_num_batched_tokens=8)
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    scheduler.add_request(request("first", PROMPT, max_tokens=1))
    saving = scheduler.schedule()
    assert saving is not None and saving.scheduled[0].state_save >= 0
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
        assert chunks[0].num_new_tokens == len(PROMPT), "no cut without snapshots"
        assert all(chunk.state_save == -1 and chunk.state_load == -1 for chunk in chunks)
    assert scheduler.stats().prefix_cache_hits == 0
