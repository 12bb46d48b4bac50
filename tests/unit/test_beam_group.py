"""Beam-group bookkeeping in the scheduler, driven by hand-made results (no model): the prompt is prefilled
once, the fork shares its full blocks among all beams and copies its partial last block for all but the first
child (copy-on-write), used-block counts equal shared + per-beam blocks, dropped beams give their blocks back,
and nothing leaks at the end, on abort or on preemption. Also the HF stopping rule on fixed candidates."""

from __future__ import annotations

import numpy as np
import pytest

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import GenerateRequest, SlotFailure, StepPlan, StepResult, TokenLogprobs
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.admission import RequestRejected
from rapid_llm.scheduler_proc.beam_search import BeamSearch
from rapid_llm.scheduler_proc.scheduler import Scheduler

BLOCK = 4
EOS = 1
PROMPT = list(range(10, 20))  # 10 tokens: two full blocks and half of a third
WIDTH = 3
K = 2 * WIDTH  # candidates per beam with one EOS id


def _scheduler(num_blocks: int = 64, max_num_seqs: int = 8) -> Scheduler:
    return Scheduler(SchedulerConfig(max_model_len=64, block_size=BLOCK, max_num_seqs=max_num_seqs,
                                     max_num_batched_tokens=32, num_kv_blocks=num_blocks, eos_token_ids=(EOS,)))


def _request(request_id: str = "beam", max_tokens: int = 3, prompt: list[int] = PROMPT) -> GenerateRequest:
    return GenerateRequest(request_id, prompt, SamplingParams(n=2, beam_width=WIDTH, use_beam_search=True,
                                                              temperature=0.0, max_tokens=max_tokens))


def _answer(plan: StepPlan, candidates: dict[int, list[tuple[int, float]]]) -> StepResult:
    """The result of `plan`: each sampling slot's top candidates (token, logprob), best first."""
    slots = sorted(candidates)
    logprobs = [TokenLogprobs(candidates[slot][0][1], [t for t, _ in candidates[slot]],
                              [lp for _, lp in candidates[slot]]) for slot in slots]
    return StepResult(plan.step_id, slots, [candidates[slot][0][0] for slot in slots], logprobs)


def _spread(base: int, top: float) -> list[tuple[int, float]]:
    return [(base + i, top - i) for i in range(K)]


def _group(scheduler: Scheduler):
    (request,) = scheduler._running
    return request.beam


def test_prefill_once_then_fork_shares_full_blocks_and_copies_the_partial_one() -> None:
    scheduler = _scheduler()
    scheduler.add_request(_request())
    prefill = scheduler.schedule()
    assert [(c.num_computed_tokens, c.num_new_tokens) for c in prefill.scheduled] == [(0, 10)]
    assert prefill.new_requests[0].params.logprobs == K and not prefill.new_requests[0].params.use_beam_search
    # The group waits for its result: nothing more is planned for it (async scheduling plans ahead).
    assert scheduler.schedule() is None
    root_slot = prefill.scheduled[0].slot
    prompt_blocks = list(prefill.scheduled[0].new_block_ids)
    scheduler.process_result(_answer(prefill, {root_slot: _spread(100, -1.0)}))
    blocks = scheduler._blocks
    # All three beams reference the two full prompt blocks and (until the copies are planned) the partial one.
    assert [blocks.ref_count(b) for b in prompt_blocks] == [WIDTH] * 3
    step = scheduler.schedule()
    assert len(step.scheduled) == WIDTH and all(c.num_computed_tokens == 10 for c in step.scheduled)
    assert [copy.src for copy in step.block_copies] == [prompt_blocks[2]] * (WIDTH - 1)
    targets = [copy.dst for copy in step.block_copies]
    # The first child continues in the root's slot (told its token); the others enter fresh slots.
    assert step.last_tokens[0].slot == root_slot and step.last_tokens[0].token_id == 100
    assert [new.token_ids for new in step.new_requests] == [PROMPT + [101], PROMPT + [102]]
    for new, chunk in zip(step.new_requests, [c for c in step.scheduled if c.slot != root_slot]):
        # A copy target rides with the shared blocks, so the worker does not zero it before copying.
        assert chunk.cached_block_ids[:2] == prompt_blocks[:2] and chunk.cached_block_ids[2] in targets
        assert chunk.new_block_ids == []
    assert [blocks.ref_count(b) for b in prompt_blocks] == [WIDTH, WIDTH, 1]
    # Shared: 2 full prompt blocks; per beam: its own third block.
    assert scheduler.stats().kv_blocks_used == 2 + WIDTH
    assert scheduler.stats().num_running == 1


def _run_to_fork(scheduler: Scheduler) -> StepPlan:
    prefill = scheduler.schedule()
    scheduler.process_result(_answer(prefill, {prefill.scheduled[0].slot: _spread(100, -1.0)}))
    return scheduler.schedule()


def test_dropped_beams_free_their_blocks_and_a_parent_with_two_children_forks_again() -> None:
    scheduler = _scheduler()
    scheduler.add_request(_request(max_tokens=4))
    step = _run_to_fork(scheduler)
    group = _group(scheduler)
    best, other, worst = group.beams
    # Beam `best` wins all three places: the two other beams are dropped, `best` forks three ways again.
    answers = {best.slot: _spread(200, -0.1), other.slot: _spread(300, -5.0), worst.slot: _spread(400, -6.0)}
    scheduler.process_result(_answer(step, answers))
    assert [beam.output_token_ids for beam in group.beams] == [[100, 200], [100, 201], [100, 202]]
    assert scheduler._released_slots[-2:] == [other.slot, worst.slot]
    step = scheduler.schedule()
    # 11 tokens computed: the parent's third block is still partial, so two copies again (token 12 fits in it).
    assert len(step.block_copies) == WIDTH - 1
    assert scheduler.stats().kv_blocks_used == 2 + WIDTH
    candidates = {beam.slot: _spread(500 + 10 * i, -0.1) for i, beam in enumerate(group.beams)}
    scheduler.process_result(_answer(step, candidates))
    step = scheduler.schedule()
    # 12 tokens computed fill the third block: the children share it and each needs a fresh fourth block.
    assert step.block_copies == [] and all(len(c.new_block_ids) == 1 for c in step.scheduled)
    candidates = {beam.slot: _spread(700 + 10 * i, -0.1) for i, beam in enumerate(group.beams)}
    scheduler.process_result(_answer(step, candidates))
    assert not scheduler.has_unfinished_requests()
    assert scheduler.stats().kv_blocks_used == 0
    (update,) = scheduler.take_outputs().updates
    assert update.finish_reason == "length" and len(update.beams) == 2 and update.token_ids == []
    assert [len(beam.token_ids) for beam in update.beams] == [4, 4]
    assert update.beams[0].score >= update.beams[1].score


def test_abort_frees_every_block_and_slot() -> None:
    scheduler = _scheduler()
    scheduler.add_request(_request())
    _run_to_fork(scheduler)
    scheduler.abort_request("beam")
    assert scheduler.stats().kv_blocks_used == 0 and len(scheduler._free_slots) == 8
    assert not scheduler.has_unfinished_requests()


def _drive(scheduler: Scheduler, depth: int) -> list:
    """Plan up to `depth` steps ahead and answer them in order until every request is done; the updates."""
    updates, inflight = [], []
    for _ in range(500):
        while len(inflight) < depth and (plan := scheduler.schedule()) is not None:
            inflight.append((plan, scheduler._inflight[-1].samplers))
        if not inflight:
            break
        plan, samplers = inflight.pop(0)
        answers = {slot: _spread(200 + 7 * slot, -0.1 * (slot + 1)) if request.beam is not None else [(5, -0.1)]
                   for slot, (request, _) in samplers.items()}
        scheduler.process_result(_answer(plan, answers))
        batch = scheduler.take_outputs()
        updates += batch.updates if batch else []
    assert not scheduler.has_unfinished_requests()
    return updates


@pytest.mark.parametrize("beam_first", [True, False], ids=["beam-first", "plain-first"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lock-step", "async"])
def test_preemption_under_kv_pressure_loses_nothing_and_leaks_nothing(beam_first: bool, depth: int) -> None:
    """16 blocks: the group (2 shared, then 3-9 of its own) and a 46-token plain request (12) cannot both stay:
    whichever is newer is preempted (a group as a whole, restarting from its prompt) and both still finish."""
    scheduler = _scheduler(num_blocks=16)
    plain = GenerateRequest("plain", list(range(30, 60)), SamplingParams(temperature=0.0, max_tokens=16))
    requests = [_request(max_tokens=8), plain]
    for request in requests if beam_first else requests[::-1]:
        scheduler.add_request(request)
    updates = _drive(scheduler, depth)
    assert scheduler.stats().num_preemptions >= 1
    assert scheduler.stats().kv_blocks_used == 0 and len(scheduler._free_slots) == 8
    finished = {update.request_id: update for update in updates if update.finish_reason is not None}
    assert finished["plain"].finish_reason == "length"
    assert sum(len(u.token_ids) for u in updates if u.request_id == "plain") == 16
    assert [len(beam.token_ids) for beam in finished["beam"].beams] == [8, 8]


def test_admission_refuses_beams_beyond_the_logprobs_or_slots() -> None:
    scheduler = _scheduler(max_num_seqs=4)
    params = dict(use_beam_search=True, temperature=0.0)
    with pytest.raises(RequestRejected, match="max_num_seqs"):
        scheduler.add_request(GenerateRequest("a", PROMPT, SamplingParams(n=5, **params)))
    with pytest.raises(RequestRejected, match="candidates"):
        scheduler.add_request(GenerateRequest("b", PROMPT, SamplingParams(n=4, stop_token_ids=[5, 6, 7, 8, 9], **params)))


def _search(**params) -> BeamSearch:
    return BeamSearch(SamplingParams(use_beam_search=True, temperature=0.0, **params), 5, (EOS,))


def test_early_stopping_true_stops_once_width_hypotheses_exist() -> None:
    search = _search(n=2, early_stopping=True)
    # The two best continuations end (EOS, then stop): both are hypotheses, and the search is full.
    running = search.step([[]], [np.float32(0)], [[(EOS, -0.1), (7, -0.2), (8, -0.3), (9, -0.4)]])
    assert [c.token_id for c in running] == [7, 8] and not search.done
    search.step([[7], [8]], [c.cumulative_logprob for c in running],
                [[(EOS, -0.1), (4, -3.0), (5, -3.1), (6, -3.2)], [(2, -3.0), (3, -3.1), (4, -3.2), (5, -3.3)]])
    assert search.done and [h.token_ids for h in search.best()] == [[EOS], [7, EOS]]
    assert search.best()[1].score == pytest.approx((-0.2 - 0.1) / 2)


def test_early_stopping_false_stops_when_no_live_beam_can_win() -> None:
    search = _search(n=1, beam_width=2, length_penalty=1.0)
    running = search.step([[]], [np.float32(0)], [[(EOS, -0.1), (EOS + 1, -0.2), (7, -9.0), (8, -9.5)]])
    assert not search.done  # one hypothesis of two: the bound has nothing to compare with yet
    search.step([[EOS + 1], [7]], [c.cumulative_logprob for c in running],
                [[(EOS, -0.1), (4, -0.2), (5, -0.3), (6, -0.4)], [(2, -3.0), (3, -3.1), (4, -3.2), (5, -3.3)]])
    # Hypotheses -0.1 and -0.15 fill the width; the best live beam scores (-0.4) / 2 = -0.2 < -0.15.
    assert search.done and search.best()[0].token_ids == [EOS]


def test_a_failed_beam_slot_ends_the_group_and_frees_everything() -> None:
    scheduler = _scheduler()
    scheduler.add_request(_request())
    step = _run_to_fork(scheduler)
    group = _group(scheduler)
    failed, *others = [beam.slot for beam in group.beams]
    result = _answer(step, {slot: _spread(200, -0.1) for slot in others})
    result.failures.append(SlotFailure(failed, "beam", "boom"))
    scheduler.process_result(result)
    (update,) = scheduler.take_outputs().updates
    assert update.finish_reason == "abort" and update.error_kind == "internal" and update.beams == []
    assert scheduler.stats().kv_blocks_used == 0 and len(scheduler._free_slots) == 8
