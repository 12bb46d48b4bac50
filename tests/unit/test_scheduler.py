"""Tests for the scheduler policy, driven by a fake worker that executes plans faithfully.

The fake worker keeps per-slot tokens and block tables, simulates the paged KV cache (one token id
per cached position; a fresh block reads as garbage until written, a prefix-cache hit keeps what
another request wrote) and samples a deterministic function of the sequence it reads back from that
cache, so outputs can be checked against a direct computation that uses no scheduler at all.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import GenerateRequest, ScheduledChunk, StepPlan, StepResult, TokenBatch, TokenLogprobs
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.scheduler import Scheduler

VOCAB = 24
EOS = 3
ModelFn = Callable[[Sequence[int]], int]
Event = GenerateRequest | str  # a string aborts that request id


def hashed_model(tokens: Sequence[int]) -> int:
    return zlib.crc32(array("q", tokens).tobytes()) % VOCAB


def counting_model(tokens: Sequence[int]) -> int:
    return tokens[-1] + 1


def pick(model: ModelFn, tokens: Sequence[int], num_prompt_tokens: int, params: SamplingParams,
         eos_token_ids: Sequence[int]) -> int:
    """What the real sampler returns: the model's token, with stop ids masked below min_tokens."""
    token = model(tokens)
    banned = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
    while len(tokens) - num_prompt_tokens < params.min_tokens and token in banned:
        token += 1
    return token


@dataclass
class Outcome:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def reference(request: GenerateRequest, config: SchedulerConfig, model: ModelFn) -> Outcome:
    """The request's output computed token by token, without any scheduler."""
    params, tokens = request.params, list(request.prompt_token_ids)
    outcome = Outcome()
    while outcome.finish_reason is None:
        token = pick(model, tokens, len(request.prompt_token_ids), params, config.eos_token_ids)
        tokens.append(token)
        outcome.token_ids.append(token)
        if token in params.stop_token_ids:
            outcome.finish_reason, outcome.stop_reason = "stop", token
        elif token in config.eos_token_ids and not params.ignore_eos:
            outcome.finish_reason = "stop"
        elif len(outcome.token_ids) == params.max_tokens or len(tokens) == config.max_model_len:
            outcome.finish_reason = "length"
    return outcome


@dataclass
class _Slot:
    request_id: str
    tokens: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)


GARBAGE = -1  # what a freshly allocated (zeroed, never written) KV position holds


class FakeWorker:
    """Executes plans in order as the real worker would, checking every promise a plan makes.

    Like the real attention backend, a step first writes the K/V of every scheduled token, then reads.
    """

    def __init__(self, config: SchedulerConfig, model: ModelFn) -> None:
        self.config = config
        self.model = model
        self.slots: dict[int, _Slot] = {}
        self.kv: dict[int, list[int]] = {}  # block id -> token id cached at each position
        self.plans: list[StepPlan] = []
        self.admissions: list[str] = []  # request ids of every NewRequest, resumptions included
        self.num_sampled: dict[str, int] = {}

    def execute(self, plan: StepPlan) -> StepResult:
        config, block_size = self.config, self.config.block_size
        assert plan.step_id == len(self.plans)
        self.plans.append(plan)
        assert sum(chunk.num_new_tokens for chunk in plan.scheduled) <= config.max_num_batched_tokens
        assert len({chunk.slot for chunk in plan.scheduled}) == len(plan.scheduled) <= config.max_num_seqs
        for slot in plan.released_slots:
            assert slot in self.slots, f"released slot {slot} holds no request"
            del self.slots[slot]
        for new in plan.new_requests:
            assert 0 <= new.slot < config.max_num_seqs and new.slot not in self.slots
            self.slots[new.slot] = _Slot(new.request_id, list(new.token_ids), new.num_prompt_tokens, new.params)
            self.admissions.append(new.request_id)
        for chunk in plan.scheduled:
            self._write(chunk)
        slots, token_ids, logprobs = [], [], []
        for chunk in plan.scheduled:
            state = self.slots[chunk.slot]
            if state.num_computed == len(state.tokens):
                cached = [self.kv[state.blocks[p // block_size]][p % block_size] for p in range(state.num_computed)]
                assert cached == state.tokens, "the KV cache was overwritten or a cache hit held other tokens"
                token = pick(self.model, cached, state.num_prompt_tokens, state.params, config.eos_token_ids)
                state.tokens.append(token)
                self.num_sampled[state.request_id] = self.num_sampled.get(state.request_id, 0) + 1
                slots.append(chunk.slot)
                token_ids.append(token)
                logprobs.append(None if state.params.logprobs is None else TokenLogprobs(-float(token)))
        assert all(0 <= block < config.num_kv_blocks for state in self.slots.values() for block in state.blocks)
        has_logprobs = any(entry is not None for entry in logprobs)
        return StepResult(plan.step_id, slots, token_ids, logprobs if has_logprobs else [])

    def _write(self, chunk: ScheduledChunk) -> None:
        """Extend the slot's block table and write the chunk's tokens into the simulated cache."""
        block_size = self.config.block_size
        state = self.slots[chunk.slot]
        start, end = chunk.num_computed_tokens, chunk.num_computed_tokens + chunk.num_new_tokens
        assert start == state.num_computed + len(chunk.cached_block_ids) * block_size, \
            "a chunk must continue exactly where its slot stopped, after any cache hits"
        assert not chunk.cached_block_ids or not state.blocks, "cache hits only start a request's block table"
        assert chunk.num_new_tokens >= 1 and end <= len(state.tokens) and end <= self.config.max_model_len
        holders = self._holders()
        for block in chunk.new_block_ids:
            assert holders.get(block, []) == [], "a freshly allocated block is held by a live slot"
            self.kv[block] = [GARBAGE] * block_size
        state.blocks += chunk.cached_block_ids + chunk.new_block_ids
        assert len(state.blocks) == -(-end // block_size), "blocks must cover the tokens, no more"
        for position in range(start, end):
            block, offset, token = state.blocks[position // block_size], position % block_size, state.tokens[position]
            for other, index in holders.get(block, []):
                # Sharing is only sound if everyone holding the block expects the same token there.
                expected = other.tokens[index * block_size + offset] if other is not state else token
                assert expected == token, "a block shared with another live slot is overwritten"
            self.kv[block][offset] = token
        state.num_computed = end

    def _holders(self) -> dict[int, list[tuple[_Slot, int]]]:
        """block id -> (live slot, index in its block table) for every block some live slot holds."""
        holders: dict[int, list[tuple[_Slot, int]]] = {}
        for state in self.slots.values():
            for index, block in enumerate(state.blocks):
                holders.setdefault(block, []).append((state, index))
        return holders


@dataclass
class Run:
    outcomes: dict[str, Outcome]
    worker: FakeWorker
    added: list[str]
    admissions: list[str]  # request ids of every NewRequest, resumptions included
    num_preemptions: int  # as the scheduler's stats report it

    @property
    def preempted(self) -> bool:
        return len(self.admissions) > len(set(self.admissions))


class _Collector:
    """Checks the stream the detokenizer would see and assembles each request's outcome."""

    def __init__(self) -> None:
        self.params: dict[str, SamplingParams] = {}
        self.outcomes: dict[str, Outcome] = {}

    def add(self, batch: TokenBatch | None) -> None:
        if batch is None:
            return
        assert batch.new_requests or batch.updates, "take_outputs returns None when there is nothing"
        for new in batch.new_requests:
            assert new.request_id not in self.outcomes
            self.outcomes[new.request_id] = Outcome()
        for update in batch.updates:
            outcome = self.outcomes[update.request_id]
            assert outcome.finish_reason is None, "no update after the finishing one"
            # Exactly the update with the first token has the timings, whatever preemptions came between.
            if update.token_ids and not outcome.token_ids:
                assert update.queue_time is not None and update.queue_time >= 0
                assert update.prefill_time is not None and update.prefill_time >= 0
            else:
                assert update.queue_time is None and update.prefill_time is None
            if self.params[update.request_id].logprobs is None:
                assert update.logprobs == []
            else:
                assert [entry.logprob for entry in update.logprobs] == [-float(t) for t in update.token_ids]
            outcome.token_ids += update.token_ids
            outcome.finish_reason, outcome.stop_reason = update.finish_reason, update.stop_reason


def drive(config: SchedulerConfig, events: dict[int, list[Event]], depth: int,
          model: ModelFn = hashed_model) -> Run:
    """Run the scheduler loop with `depth` plans in flight; `events[i]` happen before iteration i plans."""
    scheduler, worker, collector = Scheduler(config), FakeWorker(config, model), _Collector()
    events, sent, added = dict(events), deque[StepPlan](), []
    iteration = 0
    while True:
        for event in events.pop(iteration, []):
            if isinstance(event, str):
                scheduler.abort_request(event)
            else:
                scheduler.add_request(event)
                collector.params[event.request_id] = event.params
                added.append(event.request_id)
        while scheduler.num_inflight_steps < depth and (plan := scheduler.schedule()) is not None:
            sent.append(plan)
        collector.add(scheduler.take_outputs())
        if sent:
            scheduler.process_result(worker.execute(sent.popleft()))
        elif scheduler.has_unfinished_requests():
            raise AssertionError("requests are unfinished but nothing can be scheduled")
        elif not events:
            break
        iteration += 1
    stats = scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert scheduler._blocks.num_free_blocks == config.num_kv_blocks, "every block is free or only cached"
    assert all(outcome.finish_reason is not None for outcome in collector.outcomes.values())
    admissions = list(worker.admissions)
    _check_every_slot_released(scheduler, worker)
    return Run(collector.outcomes, worker, added, admissions, stats.num_preemptions)


def _check_every_slot_released(scheduler: Scheduler, worker: FakeWorker) -> None:
    """A probe request's plan must release every slot the worker still holds."""
    scheduler.add_request(GenerateRequest("probe", [1], SamplingParams(max_tokens=1)))
    plan = scheduler.schedule()
    assert plan is not None
    assert sorted(plan.released_slots) == sorted(worker.slots)
    scheduler.process_result(worker.execute(plan))
    assert len(worker.slots) == 1 and not scheduler.has_unfinished_requests()
    assert scheduler.stats().kv_blocks_used == 0


def make_config(**overrides: object) -> SchedulerConfig:
    values: dict = dict(max_model_len=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=256,
                        num_kv_blocks=200, eos_token_ids=(EOS,))
    values.update(overrides)
    return SchedulerConfig(**values)


def request(request_id: str, prompt: Sequence[int], **params: object) -> GenerateRequest:
    return GenerateRequest(request_id, list(prompt), SamplingParams(**params))


def random_workload(seed: int, count: int = 14) -> dict[int, list[Event]]:
    """Mixed requests; the first half arrive at once, the rest trickle in. Most prompts start with one of
    a few shared prefixes (shorter than a 4-token block, exactly 1 or 3 blocks, 2 blocks + 1 token), and
    some are nothing but one."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(length)] for length in (3, 4, 9, 12)]
    events: dict[int, list[Event]] = {}
    for index in range(count):
        max_tokens = rng.choice([1, 6, 17, 30, None])
        params = dict(
            max_tokens=max_tokens,
            min_tokens=min(rng.choice([0, 0, 3]), max_tokens or 3),
            stop_token_ids=rng.choice([[], [], [7, 11]]),
            ignore_eos=rng.random() < 0.5,
            logprobs=rng.choice([None, 2]),
        )
        shared = rng.choice([[], *prefixes])
        prompt = shared + [rng.randrange(VOCAB) for _ in range(rng.randint(0 if shared else 1, 30 - len(shared)))]
        arrival = 0 if index < count // 2 else 3 * (index - count // 2)
        events.setdefault(arrival, []).append(request(f"r{index}", prompt, **params))
    return events


def expected_outcomes(events: dict[int, list[Event]], config: SchedulerConfig,
                      model: ModelFn = hashed_model) -> dict[str, Outcome]:
    return {
        event.request_id: reference(event, config, model)
        for batch in events.values() for event in batch if isinstance(event, GenerateRequest)
    }


# ---- golden: every mode gives the reference outputs --------------------------------------------


@pytest.mark.parametrize("caching", [True, False], ids=["prefix-caching", "no-caching"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
@pytest.mark.parametrize("budget", [5, 256], ids=["tiny-budget", "large-budget"])
@pytest.mark.parametrize("num_kv_blocks", [16, 200], ids=["few-blocks", "many-blocks"])
@pytest.mark.parametrize("seed", [0, 1])
def test_outputs_match_reference_in_every_mode(depth: int, budget: int, num_kv_blocks: int, seed: int,
                                               caching: bool) -> None:
    config = make_config(max_num_batched_tokens=budget, num_kv_blocks=num_kv_blocks, enable_prefix_caching=caching)
    events = random_workload(seed)
    run = drive(config, events, depth)
    assert run.outcomes == expected_outcomes(events, config)
    assert run.preempted == (num_kv_blocks == 16)
    first_admissions = list(dict.fromkeys(run.admissions))
    assert first_admissions == run.added, "requests are admitted first come, first served"
    assert _some_prompt_was_chunked(run.worker) == (budget == 5)
    hits = any(chunk.cached_block_ids for plan in run.worker.plans for chunk in plan.scheduled)
    # With few blocks, eviction may leave nothing to hit; with many, shared prefixes must hit.
    assert hits == caching if num_kv_blocks == 200 else hits <= caching


def _some_prompt_was_chunked(worker: FakeWorker) -> bool:
    for plan in worker.plans:
        first_chunks = {chunk.slot: chunk.num_computed_tokens + chunk.num_new_tokens for chunk in plan.scheduled}
        if any(first_chunks[new.slot] < len(new.token_ids) for new in plan.new_requests):
            return True
    return False


def test_prompt_longer_than_the_budget_is_chunked_and_decodes_go_first() -> None:
    config = make_config(max_num_batched_tokens=5)
    events: dict[int, list[Event]] = {0: [request("a", range(2), max_tokens=8, ignore_eos=True)],
                                      2: [request("b", range(10, 23), max_tokens=2, ignore_eos=True)]}
    run = drive(config, events, depth=1, model=counting_model)
    chunks = [[(c.slot, c.num_computed_tokens, c.num_new_tokens) for c in plan.scheduled] for plan in run.worker.plans]
    assert chunks[:6] == [
        [(0, 0, 2)], [(0, 2, 1)],
        [(0, 3, 1), (1, 0, 4)], [(0, 4, 1), (1, 4, 4)], [(0, 5, 1), (1, 8, 4)], [(0, 6, 1), (1, 12, 1)],
    ]
    assert run.outcomes["b"].token_ids == [23, 24]


def test_max_num_seqs_caps_the_running_set() -> None:
    config = make_config(max_num_seqs=2)
    events: dict[int, list[Event]] = {0: [request(f"r{i}", [i + 1], max_tokens=3, ignore_eos=True) for i in range(5)]}
    run = drive(config, events, depth=2, model=counting_model)
    assert all(len(plan.scheduled) <= 2 for plan in run.worker.plans)
    assert [new.request_id for new in run.worker.plans[0].new_requests] == ["r0", "r1"]
    assert run.outcomes == expected_outcomes(events, config, counting_model)


def test_fcfs_does_not_skip_a_request_that_cannot_be_admitted() -> None:
    config = make_config(num_kv_blocks=16, max_num_batched_tokens=100)
    events: dict[int, list[Event]] = {0: [
        request("a", [1] * 40, max_tokens=2, ignore_eos=True),
        request("b", [2] * 30, max_tokens=2, ignore_eos=True),  # needs 8 blocks, only 6 are left
        request("c", [3] * 4, max_tokens=2, ignore_eos=True),  # would fit, but must wait behind b
    ]}
    run = drive(config, events, depth=2)
    assert [new.request_id for new in run.worker.plans[0].new_requests] == ["a"]
    assert run.admissions == ["a", "b", "c"]
    assert run.outcomes == expected_outcomes(events, config)


def test_preemption_takes_the_newest_and_resumes_it_first_with_its_outputs() -> None:
    config = make_config(max_model_len=16, num_kv_blocks=4, max_num_seqs=2)
    events: dict[int, list[Event]] = {0: [
        request("a", range(10, 17), max_tokens=6, ignore_eos=True),
        request("b", range(30, 37), max_tokens=4, ignore_eos=True),
        request("c", [50], max_tokens=2, ignore_eos=True),  # fits in the block left after step 2
    ]}
    run = drive(config, events, depth=1, model=counting_model)
    plans = run.worker.plans
    # Step 2: a's 9th token needs a third block; the pool is full, so b (newer) gives its blocks up.
    assert plans[2].released_slots == [1]
    assert [(c.slot, c.num_computed_tokens, c.num_new_tokens) for c in plans[2].scheduled] == [(0, 8, 1)]
    # b went back to the front of the queue: c may not overtake it.
    assert run.admissions == ["a", "b", "b", "c"]
    assert run.num_preemptions == 1
    resumed = [new for plan in plans for new in plan.new_requests if new.request_id == "b"][1]
    assert resumed.token_ids == [*range(30, 37), 37, 38] and resumed.num_prompt_tokens == 7
    assert run.outcomes == expected_outcomes(events, config, counting_model)


def test_a_request_that_preempts_itself_waits_for_a_later_step() -> None:
    config = make_config(max_model_len=16, num_kv_blocks=4, max_num_seqs=2, max_num_batched_tokens=2)
    events: dict[int, list[Event]] = {0: [request("a", range(10, 14), max_tokens=9, ignore_eos=True),
                                          request("b", range(30, 34), max_tokens=3, ignore_eos=True)]}
    run = drive(config, events, depth=1, model=counting_model)
    # Step 6: a takes the last free block; b needs one more, is the newest, so it preempts itself.
    # The block it frees would take a 1-token chunk of b again, but that would only thrash.
    step = run.worker.plans[6]
    assert [(c.slot, c.num_computed_tokens, c.num_new_tokens) for c in step.scheduled] == [(0, 8, 1)]
    assert (step.released_slots, step.new_requests) == ([1], [])
    assert run.num_preemptions == 1
    assert run.outcomes == expected_outcomes(events, config, counting_model)


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
    _check_every_slot_released(scheduler, worker)


# ---- contract checks ---------------------------------------------------------------------------


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


@pytest.mark.parametrize(("prompt", "message"), [([], "at least 1"), ([1] * 64, "fewer than max_model_len")])
def test_add_request_rejects_prompts_that_cannot_run(prompt: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(make_config()).add_request(request("r", prompt))


@pytest.mark.parametrize("prompt", [[1, 600], [-1, 2]])
def test_add_request_rejects_token_ids_outside_the_vocabulary(prompt: list[int]) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 512\)"):
        Scheduler(make_config(vocab_size=512)).add_request(request("r", prompt))


def test_add_request_rejects_max_tokens_below_one() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        Scheduler(make_config()).add_request(request("r", [1], max_tokens=0))


def test_add_request_rejects_a_duplicate_id() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add_request(request("r", [1]))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(request("r", [2]))


@pytest.mark.parametrize(("num_kv_blocks", "message"), [(0, "num_kv_blocks"), (15, "fewer than max_model_len")])
def test_config_must_fit_one_full_length_request(num_kv_blocks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(make_config(num_kv_blocks=num_kv_blocks))


def test_results_must_match_the_oldest_plan() -> None:
    scheduler = Scheduler(make_config())
    scheduler.add_request(request("r", [1, 2]))
    with pytest.raises(ValueError, match="no step is in flight"):
        scheduler.process_result(StepResult(0, [0], [5]))
    plan = scheduler.schedule()
    assert plan is not None
    with pytest.raises(ValueError, match="expected step 0"):
        scheduler.process_result(StepResult(1, [0], [5]))
    with pytest.raises(ValueError, match="planned"):
        scheduler.process_result(StepResult(0, [3], [5]))
    with pytest.raises(ValueError, match="differ in length"):
        scheduler.process_result(StepResult(0, [0], [5, 6]))


def test_scheduler_imports_no_torch() -> None:
    code = "import sys, rapid_llm.scheduler_proc.scheduler; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
