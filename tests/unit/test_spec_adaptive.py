"""Adaptive off (spec_decode/adaptive.py): the windowed acceptance rule, pauses and probes with their backoff,
the config's bounds, and the scheduler with a fake worker -- a request whose drafts are always rejected, or
that the proposer never offers drafts, stops drafting and probes again, its tokens and the block accounting
unchanged, and is planned ahead again; well-accepted requests never pause; the counter reaches /metrics."""

from __future__ import annotations

from functools import partial

import httpx
import pytest

import tests.unit.test_spec_scheduler as spec_tests
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import SchedulerStats
from rapid_llm.scheduler_proc.request_state import RequestState
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.spec_decode.adaptive import AdaptiveOff
from rapid_llm.spec_decode.proposer import Proposal, Proposer
from rapid_llm.spec_decode.registry import register_proposer
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_frontend_metrics import metric
from tests.unit.test_scheduler import make_config, request


class _NoDrafts(Proposer):
    """Finds nothing, as n-gram lookup on text without repeats."""

    def propose(self, contexts, max_drafts) -> list[Proposal]:
        return [Proposal() for _ in contexts]


register_proposer("mock-none", _NoDrafts)


def _config(**fields: object) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", num_speculative_tokens=3, **fields)


def _state(max_tokens: int = 200) -> RequestState:
    state = RequestState(request("a", [1, 2, 3], max_tokens=max_tokens), max_model_len=512, block_size=4)
    state.speculates = True
    return state


def _verify(adaptive: AdaptiveOff, state: RequestState, drafted: int, accepted: int) -> None:
    """What `Speculation.verified` does around the call: the verification's tokens are outputs already."""
    state.output_token_ids += [0] * (accepted + 1)
    adaptive.record(state, drafted, accepted)


def test_a_full_window_below_the_threshold_pauses_until_the_probe() -> None:
    adaptive = AdaptiveOff(_config(acceptance_threshold=0.3, acceptance_window=3, probe_after_tokens=5))
    state = _state()
    _verify(adaptive, state, 3, 1)
    _verify(adaptive, state, 3, 0)
    assert adaptive.may_draft(state) and state.speculates  # the window is not full yet
    _verify(adaptive, state, 3, 0)  # 1 of 9 < 0.3
    assert not state.speculates and adaptive.num_disables == 1
    paused_at = state.num_output_tokens
    for _ in range(4):
        assert not adaptive.may_draft(state)
        state.output_token_ids.append(0)
    assert not adaptive.may_draft(state)
    state.output_token_ids.append(0)
    assert state.num_output_tokens == paused_at + 5
    assert adaptive.may_draft(state) and state.speculates and adaptive.num_probes == 1


def test_failed_probes_double_the_wait_and_a_passing_window_resets_it() -> None:
    adaptive = AdaptiveOff(_config(acceptance_threshold=0.5, acceptance_window=2, probe_after_tokens=4))
    state = _state(max_tokens=10_000)
    waits = []
    for _ in range(7):
        _verify(adaptive, state, 2, 0)
        _verify(adaptive, state, 2, 0)
        start = state.num_output_tokens
        while not adaptive.may_draft(state):
            state.output_token_ids.append(0)
        waits.append(state.num_output_tokens - start)
    assert waits == [4, 8, 16, 32, 64, 64, 64]  # capped at 16 x probe_after_tokens
    _verify(adaptive, state, 2, 2)
    _verify(adaptive, state, 2, 1)  # 3 of 4 passes
    assert state.speculates
    _verify(adaptive, state, 2, 0)  # the moving window: 1 of 4 fails, the wait is back to the base
    assert not state.speculates
    start = state.num_output_tokens
    while not adaptive.may_draft(state):
        state.output_token_ids.append(0)
    assert state.num_output_tokens - start == 4 and adaptive.num_disables == 8


def test_threshold_zero_never_pauses_and_steps_without_drafts_do_not_count() -> None:
    off = AdaptiveOff(_config(acceptance_threshold=0.0, acceptance_window=1))
    state = _state()
    for _ in range(5):
        _verify(off, state, 3, 0)
    assert state.speculates and off.num_disables == 0
    adaptive = AdaptiveOff(_config(acceptance_threshold=0.5, acceptance_window=1))
    adaptive.record(state, 0, 0)
    assert state.speculates and adaptive.may_draft(state)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("acceptance_threshold", 1.5, "acceptance_threshold must be in [0, 1]"),
    ("acceptance_threshold", -0.1, "acceptance_threshold must be in [0, 1]"),
    ("acceptance_window", 0, "acceptance_window must be at least 1"),
    ("probe_after_tokens", 0, "probe_after_tokens must be at least 1"),
])
def test_config_bounds_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, field: value})


def _long_workload() -> list:
    return [request("a", [5, 6, 7, 5, 6, 7, 5, 6], max_tokens=60, ignore_eos=True),
            request("c", list(range(4, 21)), max_tokens=50, ignore_eos=True),
            request("e", [9, 9, 9], max_tokens=3)]


@pytest.mark.parametrize("depth", [1, 2])
def test_rejected_drafts_pause_speculation_without_changing_tokens(depth: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    requests = _long_workload()
    expected = spec_tests.expected(requests)
    monkeypatch.setattr(spec_tests, "SpeculativeConfig", partial(SpeculativeConfig, acceptance_threshold=0.0))
    baseline, never, _ = spec_tests.run(requests, "mock-wrong", depth)
    monkeypatch.setattr(spec_tests, "SpeculativeConfig", partial(
        SpeculativeConfig, acceptance_threshold=0.2, acceptance_window=2, probe_after_tokens=6))
    outcomes, scheduler, _ = spec_tests.run(requests, "mock-wrong", depth)
    for result in (baseline, outcomes):
        assert {rid: outcome.token_ids for rid, outcome in result.items()} == expected
    stats, plain = scheduler.stats(), never.stats()
    assert plain.spec_decode_num_disables == 0
    # a and c pause after 2 verifications, probe after 6 tokens, pause again (12, 24, ... tokens later).
    assert stats.spec_decode_num_disables >= 4 and scheduler._speculation.adaptive.num_probes >= 2
    assert stats.spec_decode_num_draft_tokens < plain.spec_decode_num_draft_tokens / 2


def test_steps_without_drafts_count_as_rejected_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = _long_workload()
    monkeypatch.setattr(spec_tests, "SpeculativeConfig", partial(SpeculativeConfig, acceptance_threshold=0.0))
    _, never, _ = spec_tests.run(requests, "mock-none", 2)
    monkeypatch.setattr(spec_tests, "SpeculativeConfig", partial(
        SpeculativeConfig, acceptance_threshold=0.2, acceptance_window=3, probe_after_tokens=6))
    outcomes, scheduler, _ = spec_tests.run(requests, "mock-none", 2)
    assert {rid: outcome.token_ids for rid, outcome in outcomes.items()} == spec_tests.expected(requests)
    assert never.stats().spec_decode_num_disables == 0 and scheduler.stats().spec_decode_num_disables >= 4
    assert scheduler.stats().spec_decode_num_drafts == 0


@pytest.mark.parametrize("method", ["mock-wrong", "mock-none"])
def test_a_paused_request_is_planned_ahead_again(method: str) -> None:
    speculative = SpeculativeConfig(method=method, num_speculative_tokens=2, acceptance_threshold=0.5,
                                    acceptance_window=1, probe_after_tokens=100)
    scheduler = Scheduler(make_config(speculative=speculative))
    worker = spec_tests.SpecWorker(4)
    scheduler.add_request(request("a", [1, 2, 3], max_tokens=20, ignore_eos=True))
    # mock-wrong: the prefill, then one verification that rejects everything; mock-none: the prefill, then the
    # next step finds no draft and pauses at once.
    for _ in range(2 if method == "mock-wrong" else 1):
        plan = scheduler.schedule()
        assert plan is not None and scheduler.schedule() is None  # lock-step while it speculates
        scheduler.process_result(worker.execute(plan))
    first, second = scheduler.schedule(), scheduler.schedule()
    assert scheduler.stats().spec_decode_num_disables == 1
    assert first is not None and second is not None  # two plain steps in flight at once
    assert not first.scheduled[0].draft_token_ids and not second.scheduled[0].draft_token_ids


def test_accepted_drafts_never_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_tests, "SpeculativeConfig", partial(
        SpeculativeConfig, acceptance_threshold=0.9, acceptance_window=2, probe_after_tokens=6))
    requests = _long_workload()
    outcomes, scheduler, _ = spec_tests.run(requests, "mock-right", 2)
    assert {rid: outcome.token_ids for rid, outcome in outcomes.items()} == spec_tests.expected(requests)
    assert scheduler.stats().spec_decode_num_disables == 0


async def test_the_pause_counter_is_exported(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    assert metric((await client.get("/metrics")).text, "rapid_llm:spec_decode_num_disables_total") == 0
    engine.scheduler_stats = SchedulerStats(num_running=0, num_waiting=0, kv_blocks_used=0, kv_blocks_total=4,
                                            spec_decode_num_disables=7)
    assert metric((await client.get("/metrics")).text, "rapid_llm:spec_decode_num_disables_total") == 7
