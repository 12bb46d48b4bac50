"""Speculative decoding in the scheduler, against a fake worker that verifies drafts with a deterministic model:
all accepted, partly accepted and all rejected steps, 0 % and 100 % acceptance, different draft counts in one
batch, the real n-gram proposer; lock-step and async; chunked prefill, prefix caching, preemption and aborts.
After every step each running request holds exactly the blocks of its computed tokens, every reference count
is accounted for, the budget holds, and the worker's rolled-back rows agree; at the end every block is free,
and the outputs equal the model's own tokens (speculation never changes them)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Sequence

import pytest

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest, StepPlan, StepResult
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.spec_decode.proposer import Proposal, Proposer
from rapid_llm.spec_decode.registry import register_proposer
from tests.unit.test_scheduler import EOS, Outcome, hashed_model, make_config, reference, request


def periodic_model(tokens: Sequence[int]) -> int:
    """Repeats the context with period 3: what the n-gram lookup predicts well."""
    return tokens[-3]


MODEL = hashed_model


class _MockProposer(Proposer):
    """Drafts from the test's model: `correct` leading drafts are the model's own tokens, the rest are wrong; how
    many it drafts varies with the context length (so one batch mixes draft counts)."""

    correct = 0

    def propose(self, contexts: Sequence[Sequence[int]], max_drafts: Sequence[int]) -> list[Proposal]:
        proposals = []
        for context, limit in zip(contexts, max_drafts):
            tokens = list(context)
            drafts = []
            for index in range(min(limit, 1 + len(context) % 3)):
                token = MODEL(tokens)
                drafts.append(token if index < self.correct else (token + 1) % 24)
                tokens.append(drafts[-1])
            proposals.append(Proposal(drafts))
        return proposals


class _AllWrong(_MockProposer):
    correct = 0


class _OneRight(_MockProposer):
    correct = 1


class _AllRight(_MockProposer):
    correct = 99


for _name, _cls in (("mock-wrong", _AllWrong), ("mock-one-right", _OneRight), ("mock-right", _AllRight)):
    register_proposer(_name, _cls)


@dataclass
class _Row:
    tokens: list[int]
    blocks: list[int] = field(default_factory=list)


class SpecWorker:
    """Executes plans token by token with MODEL; a chunk with drafts accepts them while they equal MODEL's."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.rows: dict[int, _Row] = {}
        self.draft_counts: list[set[int]] = []  # per step, the distinct draft counts of its chunks

    def execute(self, plan: StepPlan) -> StepResult:
        for rollback in plan.rollbacks:
            row = self.rows[rollback.slot]
            assert len(row.tokens) == rollback.num_tokens, "the scheduler and the worker disagree on the tokens"
            assert rollback.num_blocks <= len(row.blocks)
            del row.blocks[rollback.num_blocks:]
        for slot in plan.released_slots:
            del self.rows[slot]
        for new in plan.new_requests:
            self.rows[new.slot] = _Row(list(new.token_ids))
        slots, token_ids, accepted = [], [], []
        self.draft_counts.append({len(chunk.draft_token_ids) for chunk in plan.scheduled})
        for chunk in plan.scheduled:
            row = self.rows[chunk.slot]
            row.blocks += chunk.cached_block_ids + chunk.new_block_ids
            drafts = list(chunk.draft_token_ids)
            end = chunk.num_computed_tokens + chunk.num_new_tokens
            assert len(row.blocks) == -(-end // self.block_size), "blocks must cover exactly the computed tokens"
            if drafts:
                assert chunk.num_computed_tokens == len(row.tokens) - 1 and chunk.num_new_tokens == 1 + len(drafts)
            if end != len(row.tokens) + len(drafts):
                continue
            num_accepted = 0
            while num_accepted < len(drafts) and drafts[num_accepted] == MODEL(row.tokens + drafts[:num_accepted]):
                num_accepted += 1
            token = MODEL(row.tokens + drafts[:num_accepted])
            row.tokens += drafts[:num_accepted] + [token]
            slots.append(chunk.slot)
            token_ids.append(token)
            accepted.append(num_accepted)
        any_drafts = any(chunk.draft_token_ids for chunk in plan.scheduled)
        return StepResult(plan.step_id, slots, token_ids, num_accepted=accepted if any_drafts else [])


def check_accounting(scheduler: Scheduler, plan: StepPlan | None) -> None:
    config = scheduler.config
    if plan is not None:
        assert sum(chunk.num_new_tokens for chunk in plan.scheduled) <= config.max_num_batched_tokens
    references = Counter(block for state in scheduler._running for block in state.block_ids)
    for state in scheduler._running:
        assert len(state.block_ids) == -(-state.num_computed_tokens // config.block_size)
        assert state.num_computed_tokens <= state.num_tokens
    for block, count in references.items():
        assert scheduler._blocks.ref_count(block) == count
    assert scheduler._blocks.num_used_blocks == len(references)


def run(requests: list[GenerateRequest], method: str, depth: int, aborts: dict[int, str] | None = None,
        **config: object) -> tuple[dict[str, Outcome], Scheduler, SpecWorker]:
    speculative = SpeculativeConfig(method=method, num_speculative_tokens=3, prompt_lookup_max=3)
    scheduler = Scheduler(make_config(speculative=speculative, **config))
    worker = SpecWorker(scheduler.config.block_size)
    for item in requests:
        scheduler.add_request(item)
    outcomes: dict[str, Outcome] = {item.request_id: Outcome() for item in requests}
    inflight: deque[StepResult] = deque()
    step = 0
    while scheduler.has_unfinished_requests() or inflight:
        while len(inflight) < depth and (plan := scheduler.schedule()) is not None:
            check_accounting(scheduler, plan)
            inflight.append(worker.execute(plan))
        if aborts and step in aborts:
            scheduler.abort_request(aborts[step])
        scheduler.process_result(inflight.popleft())
        check_accounting(scheduler, None)
        batch = scheduler.take_outputs()
        for update in batch.updates if batch else []:
            outcomes[update.request_id].token_ids += update.token_ids
            if update.finish_reason is not None:
                outcomes[update.request_id].finish_reason = update.finish_reason
        step += 1
        assert step < 500, "no progress"
    assert scheduler._blocks.num_used_blocks == 0 and not scheduler._running
    return outcomes, scheduler, worker


def workload() -> list[GenerateRequest]:
    return [request("a", [5, 6, 7, 5, 6, 7, 5, 6], max_tokens=12, ignore_eos=True),
            request("b", [1, 2, 3, 4, 1, 2, 3], max_tokens=9),
            request("c", list(range(4, 21)), max_tokens=14, ignore_eos=True),
            request("d", [5, 6, 7, 5, 6, 7, 5, 6, 9], max_tokens=11, stop_token_ids=[EOS + 1]),
            request("e", [9, 9, 9], max_tokens=1)]


def expected(requests: list[GenerateRequest], **config: object) -> dict[str, list[int]]:
    return {item.request_id: reference(item, make_config(**config), MODEL).token_ids for item in requests}


MODES = {"plain": {}, "chunked": {"max_num_batched_tokens": 6}, "no-prefix-caching": {"enable_prefix_caching": False},
         "preemption": {"num_kv_blocks": 16, "max_model_len": 48}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("method", ["mock-wrong", "mock-one-right", "mock-right"])
def test_outputs_and_accounting_whatever_is_accepted(method: str, depth: int, mode: str) -> None:
    requests = workload()
    outcomes, scheduler, worker = run(requests, method, depth, **MODES[mode])
    assert {rid: outcome.token_ids for rid, outcome in outcomes.items()} == expected(requests, **MODES[mode])
    stats = scheduler.stats()
    assert stats.spec_decode_num_drafts > 0 and stats.spec_decode_num_draft_tokens >= stats.spec_decode_num_drafts
    if method == "mock-wrong":
        assert stats.spec_decode_num_accepted_tokens == 0  # 0 %: every step rolls back all its drafts
    elif method == "mock-right":
        assert stats.spec_decode_num_accepted_tokens == stats.spec_decode_num_draft_tokens  # 100 %
        per_position = stats.spec_decode_num_accepted_tokens_per_pos
        assert len(per_position) == 3 and per_position == sorted(per_position, reverse=True)
    else:
        assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens
        assert stats.spec_decode_num_accepted_tokens_per_pos == [stats.spec_decode_num_accepted_tokens]
    assert sum(stats.spec_decode_num_accepted_tokens_per_pos) == stats.spec_decode_num_accepted_tokens
    # Draft counts differ between requests of one step (1 to 3 drafts, and 0 for prefills).
    assert any(len(counts - {0}) > 1 for counts in worker.draft_counts)
    if mode == "preemption":
        assert stats.num_preemptions > 0


@pytest.mark.parametrize("depth", [1, 2])
def test_ngram_on_a_periodic_model_is_accepted(depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.MODEL", periodic_model)
    requests = [request("p", [4, 8, 15, 4, 8, 15], max_tokens=20, ignore_eos=True),
                request("q", [1, 2, 3], max_tokens=6, ignore_eos=True)]
    outcomes, scheduler, _ = run(requests, "ngram", depth)
    assert outcomes["p"].token_ids == [4, 8, 15] * 6 + [4, 8]
    stats = scheduler.stats()
    # One step prefills, then every step accepts its 3 drafts (the bonus makes 4 tokens a step).
    assert stats.spec_decode_num_accepted_tokens >= 15
    assert stats.num_steps <= 12


@pytest.mark.parametrize("depth", [1, 2])
def test_abort_while_drafts_are_verified_frees_everything(depth: int) -> None:
    requests = workload()
    outcomes, scheduler, _ = run(requests, "mock-one-right", depth, aborts={2: "a", 3: "c"})
    assert outcomes["a"].finish_reason == outcomes["c"].finish_reason == "abort"


def test_a_speculating_request_is_not_planned_while_its_step_is_in_flight() -> None:
    scheduler = Scheduler(make_config(speculative=SpeculativeConfig(method="mock-right", num_speculative_tokens=2)))
    worker = SpecWorker(4)
    scheduler.add_request(request("a", [1, 2, 3], max_tokens=10, ignore_eos=True))
    first = scheduler.schedule()  # the prefill, which samples
    assert first is not None and scheduler.schedule() is None
    scheduler.process_result(worker.execute(first))
    second = scheduler.schedule()
    assert second is not None and len(second.scheduled[0].draft_token_ids) == 2
    assert scheduler.schedule() is None
    scheduler.process_result(worker.execute(second))
    third = scheduler.schedule()
    assert third is not None and [rollback.num_tokens for rollback in third.rollbacks] == [3 + 1 + 3]


def test_requests_that_cannot_speculate_decode_one_token_at_a_time() -> None:
    requests = [request("penalty", [1, 2, 1, 2], max_tokens=6, repetition_penalty=1.2),
                request("logprobs", [1, 2, 1, 2], max_tokens=6, logprobs=2),
                request("min_tokens", [1, 2, 1, 2], max_tokens=6, min_tokens=2),
                request("bias", [1, 2, 1, 2], max_tokens=6, logit_bias={3: 1.0})]
    _, scheduler, worker = run(requests, "mock-right", depth=2)
    assert scheduler.stats().spec_decode_num_drafts == 0
    assert all(counts == {0} for counts in worker.draft_counts)
