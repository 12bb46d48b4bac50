"""The scheduler's test harness and its golden test: every mode gives the reference outputs.

The fake worker keeps per-slot tokens and block tables, simulates the paged KV cache (one token id
per cached position; a fresh block reads as garbage until written, a prefix-cache hit keeps what
another request wrote) and samples a deterministic function of the sequence it reads back from that
cache, so outputs can be checked against a direct computation that uses no scheduler at all.
`drive` runs the scheduler loop against it. The topic tests (test_scheduler_chunking, _preemption,
_finishing, _outputs, _contract, _prefix_cache, and the spec/beam/step-policy tests) import it from here.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import GenerateRequest, ScheduledChunk, StepPlan, StepResult, TokenBatch, TokenLogprobs
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.request_state import FREED_BLOCK
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
    tables: list[list[int]] = field(default_factory=list)  # per KV table, a block id per block of positions

    @property
    def blocks(self) -> list[int]:
        return self.tables[0]


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
        self.tier: dict[int, list[int]] = {}  # offload tier slot -> the block it keeps
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
            self.slots[new.slot] = _Slot(new.request_id, list(new.token_ids), new.num_prompt_tokens, new.params,
                                         tables=[[] for _ in config.kv_windows])
            self.admissions.append(new.request_id)
        # The real worker's order: the offload tier's saves read, copy-on-write (beam forks, partial prefix hits;
        # every source read before any target is written), new blocks zeroed (in `_write` here), the tier's loads,
        # its saves kept.
        staged = [(save.slot, list(self.kv[save.block])) for save in plan.tier_saves]
        copied = [list(self.kv[copy.src]) for copy in plan.block_copies]
        for copy, content in zip(plan.block_copies, copied):
            assert copy.src != copy.dst
            self.kv[copy.dst] = content
        for chunk in plan.scheduled:
            for block in chunk.new_block_ids:
                self.kv[block] = [GARBAGE] * block_size
        for load in plan.tier_loads:
            self.kv[load.block] = list(self.tier[load.slot])
        self.tier.update(staged)
        for chunk in plan.scheduled:
            self._write(chunk)
        slots, token_ids, logprobs = [], [], []
        for chunk in plan.scheduled:
            state = self.slots[chunk.slot]
            if state.num_computed == len(state.tokens):
                # A table reading the whole context holds every position; a windowed one was checked in `_write`.
                cached = (state.tokens if config.kv_windows[0] is not None else
                          [self.kv[state.blocks[p // block_size]][p % block_size] for p in range(state.num_computed)])
                assert cached == state.tokens, "the KV cache was overwritten or a cache hit held other tokens"
                token = pick(self.model, cached, state.num_prompt_tokens, state.params, config.eos_token_ids)
                state.tokens.append(token)
                self.num_sampled[state.request_id] = self.num_sampled.get(state.request_id, 0) + 1
                slots.append(chunk.slot)
                token_ids.append(token)
                logprobs.append(None if state.params.logprobs is None else TokenLogprobs(-float(token)))
        assert all(0 <= block < config.num_kv_blocks for state in self.slots.values() for table in state.tables
                   for block in table if block != FREED_BLOCK)
        has_logprobs = any(entry is not None for entry in logprobs)
        return StepResult(plan.step_id, slots, token_ids, logprobs if has_logprobs else [])

    def _write(self, chunk: ScheduledChunk) -> None:
        """Extend the slot's block tables and write the chunk's tokens into the simulated cache, table by table; a
        windowed table must then hold every position the chunk's tokens attend to (their windows)."""
        block_size, windows = self.config.block_size, self.config.kv_windows
        state = self.slots[chunk.slot]
        start, end = chunk.num_computed_tokens, chunk.num_computed_tokens + chunk.num_new_tokens
        num_cached, num_new = (len(ids) // len(windows) for ids in (chunk.cached_block_ids, chunk.new_block_ids))
        assert (num_cached * len(windows), num_new * len(windows)) == (len(chunk.cached_block_ids),
                                                                      len(chunk.new_block_ids)), "uneven tables"
        # A hit may end inside its last block (a radix partial hit, copied into a block of the request's own).
        hit_end = state.num_computed + num_cached * block_size
        assert start == hit_end or hit_end - block_size < start < hit_end, \
            "a chunk must continue exactly where its slot stopped, after any cache hits"
        assert not chunk.cached_block_ids or not state.blocks, "cache hits only start a request's block table"
        assert chunk.num_new_tokens >= 1 and end <= len(state.tokens) and end <= self.config.max_model_len
        holders = self._holders()
        for block in chunk.new_block_ids:
            assert holders.get(block, []) == [], "a freshly allocated block is held by a live slot"
        for table, window in enumerate(windows):
            cached = chunk.cached_block_ids[table * num_cached : (table + 1) * num_cached]
            assert FREED_BLOCK not in cached[first_held(start, window, block_size):], \
                "a hit leaves out a block the window reads"
            state.tables[table] += cached + chunk.new_block_ids[table * num_new : (table + 1) * num_new]
            blocks = state.tables[table]
            assert len(blocks) == -(-end // block_size), "blocks must cover the tokens, no more"
            for position in range(start, end):
                block, offset, token = blocks[position // block_size], position % block_size, state.tokens[position]
                for other, index in holders.get(block, []):
                    # Sharing is only sound if everyone holding the block expects the same token there.
                    expected = other.tokens[index * block_size + offset] if other is not state else token
                    assert expected == token, "a block shared with another live slot is overwritten"
                self.kv[block][offset] = token
            if window is not None:
                read = range(max(0, start - window + 1), end)
                assert [self.kv[blocks[p // block_size]][p % block_size] for p in read] == \
                    [state.tokens[p] for p in read], "a windowed table lost a position its window reads"
        state.num_computed = end

    def _holders(self) -> dict[int, list[tuple[_Slot, int]]]:
        """block id -> (live slot, index in its block table) for every block some live slot holds: in a windowed
        table, from the first block its next token's window reads (the scheduler may have freed those before)."""
        holders: dict[int, list[tuple[_Slot, int]]] = {}
        for state in self.slots.values():
            for table, window in zip(state.tables, self.config.kv_windows):
                first = first_held(state.num_computed, window, self.config.block_size)
                for index in range(first, len(table)):
                    holders.setdefault(table[index], []).append((state, index))
        return holders


def first_held(num_computed: int, window: int | None, block_size: int) -> int:
    """The first block a table still holds for a request with `num_computed` tokens (scheduler_proc's rule)."""
    return 0 if window is None else max(0, num_computed - window) // block_size


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
          model: ModelFn = hashed_model, scheduler: Scheduler | None = None) -> Run:
    """Run the scheduler loop with `depth` plans in flight; `events[i]` happen before iteration i plans."""
    scheduler = Scheduler(config) if scheduler is None else scheduler
    worker, collector = FakeWorker(config, model), _Collector()
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
    check_every_slot_released(scheduler, worker)
    return Run(collector.outcomes, worker, added, admissions, stats.num_preemptions)


def check_every_slot_released(scheduler: Scheduler, worker: FakeWorker) -> None:
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


@pytest.mark.parametrize("caching", ["radix", "hash", "radix+tier", "hash+tier", None],
                         ids=["radix", "hash", "radix-tier", "hash-tier", "no-caching"])
@pytest.mark.parametrize("depth", [1, 2], ids=["lockstep", "async"])
@pytest.mark.parametrize("budget", [5, 256], ids=["tiny-budget", "large-budget"])
@pytest.mark.parametrize("num_kv_blocks", [16, 200], ids=["few-blocks", "many-blocks"])
@pytest.mark.parametrize("seed", [0, 1])
def test_outputs_match_reference_in_every_mode(depth: int, budget: int, num_kv_blocks: int, seed: int,
                                               caching: str | None) -> None:
    policy, _, tier = (caching or "").partition("+")
    config = make_config(max_num_batched_tokens=budget, num_kv_blocks=num_kv_blocks,
                         enable_prefix_caching=caching is not None, prefix_cache_policy=policy or None,
                         kv_offload_slots=6 if tier else 0)
    events = random_workload(seed)
    run = drive(config, events, depth)
    assert run.outcomes == expected_outcomes(events, config)
    assert run.preempted == (num_kv_blocks == 16)
    first_admissions = list(dict.fromkeys(run.admissions))
    assert first_admissions == run.added, "requests are admitted first come, first served"
    assert _some_prompt_was_chunked(run.worker) == (budget == 5)
    hits = any(chunk.cached_block_ids for plan in run.worker.plans for chunk in plan.scheduled)
    # With few blocks, eviction may leave nothing to hit; with many, shared prefixes must hit.
    assert hits == bool(caching) if num_kv_blocks == 200 else hits <= bool(caching)


def _some_prompt_was_chunked(worker: FakeWorker) -> bool:
    for plan in worker.plans:
        first_chunks = {chunk.slot: chunk.num_computed_tokens + chunk.num_new_tokens for chunk in plan.scheduled}
        if any(first_chunks[new.slot] < len(new.token_ids) for new in plan.new_requests):
            return True
    return False
