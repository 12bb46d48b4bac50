"""KV tables in the scheduler (ops/attention/kv_tables.py), driven by test_scheduler.py's fake worker, which checks
each windowed table against the positions its window reads: a request holds a block per table and block of
positions, a windowed table's blocks behind the window go back to the pool, a prefix hit needs a windowed table to
cache only what its window reads, and the outputs are the reference's under preemption, chunking and async plans.
"""

from __future__ import annotations

import random

import pytest

from rapid_llm.scheduler_proc.request_state import FREED_BLOCK
from rapid_llm.scheduler_proc.scheduler import Scheduler
from tests.unit.test_scheduler import Event, FakeWorker, drive, expected_outcomes, make_config, request
from tests.unit.test_scheduler_prefix_cache import first_chunk, run_until_idle

WINDOW = 8


# Each a little over what one request may hold: 12 blocks for 48 tokens, 6 behind an 8-token window, 8 behind 16.
@pytest.mark.parametrize("windows, num_blocks",
                         [((None, WINDOW), 20), ((WINDOW,), 7), ((None, WINDOW, 2 * WINDOW), 28)],
                         ids=["full+window", "window-only", "full+two-windows"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
def test_mixed_tables_give_the_reference_outputs_under_preemption_and_chunking(windows, num_blocks: int,
                                                                             depth: int) -> None:
    config = make_config(max_model_len=48, num_kv_blocks=num_blocks, max_num_seqs=3, max_num_batched_tokens=6,
                         kv_windows=windows)
    rng = random.Random(7)
    shared = [rng.randrange(4, 24) for _ in range(20)]
    prompts = [shared + [rng.randrange(4, 24) for _ in range(n)] for n in (4, 9, 1)]
    prompts.append([rng.randrange(4, 24) for _ in range(17)])
    events: dict[int, list[Event]] = {0: [request(f"r{i}", p, max_tokens=14, ignore_eos=True)
                                          for i, p in enumerate(prompts[:3])],
                                      9: [request("late", prompts[0], max_tokens=5, ignore_eos=True),
                                          request("other", prompts[3], max_tokens=20, ignore_eos=True)]}
    run = drive(config, events, depth)
    assert run.outcomes == expected_outcomes(events, config)
    assert run.num_preemptions > 0


def test_a_window_table_frees_its_blocks_behind_the_window_and_a_hit_needs_only_its_window() -> None:
    config = make_config(max_model_len=64, num_kv_blocks=100, kv_windows=(None, WINDOW))
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    prompt = list(range(4, 28))  # 24 tokens: 6 blocks
    scheduler.add_request(request("first", prompt, max_tokens=1))
    run_until_idle(scheduler, worker)
    scheduler.add_request(request("again", prompt + [30, 31], max_tokens=2, ignore_eos=True))
    plans = run_until_idle(scheduler, worker)
    hit = first_chunk(plans, "again")
    # Six blocks hit: all six in the full table, in the window table only the two an 8-token window reads.
    assert hit.num_computed_tokens == 24
    full, windowed = hit.cached_block_ids[:6], hit.cached_block_ids[6:]
    assert FREED_BLOCK not in full and windowed[:4] == [FREED_BLOCK] * 4 and FREED_BLOCK not in windowed[4:]
    stats = scheduler.stats()
    assert stats.kv_blocks_used == 0 and stats.prefix_cache_hits == 24


def test_a_long_request_holds_its_window_not_its_context_in_a_window_table() -> None:
    config = make_config(max_model_len=64, num_kv_blocks=100, max_num_batched_tokens=4, kv_windows=(None, WINDOW))
    scheduler, worker = Scheduler(config), FakeWorker(config, lambda tokens: 5)
    scheduler.add_request(request("long", list(range(4, 44)), max_tokens=8, ignore_eos=True))
    most = 0
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        assert plan is not None
        most = max(most, scheduler.stats().kv_blocks_used)
        scheduler.process_result(worker.execute(plan))
    # 48 tokens: 12 blocks in the full table, at most the window, a chunk and a partial block at each end in the other.
    assert most <= 12 + (WINDOW + 4) // 4 + 2
