"""The speed gate (spec_decode/speed_gate.py): with a scripted clock it closes when speculating steps emit tokens
more slowly than plain ones and stays open when they are faster, holds each decision for a doubling number of
windows, does not count prefill steps, settle steps or a changed batch, and does nothing at window 0; in the
scheduler (fake worker) a closed gate plans no drafts, no `draft_after` and no lock-step, with tokens and the
block accounting unchanged; the close counter reaches /metrics."""

from __future__ import annotations

import httpx
import pytest

import tests.unit.test_spec_scheduler as spec_tests
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import SchedulerStats
from rapid_llm.scheduler_proc.scheduler import Scheduler
from rapid_llm.spec_decode.speed_gate import SpeedGate
from tests.unit.fake_engine import FakeEngine
from tests.unit.test_frontend_metrics import metric
from tests.unit.test_scheduler import make_config, request


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(gate: SpeedGate, clock: _Clock, steps: int, on_rate: float, off_rate: float,
           running: int = 8) -> list[bool]:
    """Run `steps` decode steps with `running` requests, each step emitting `running` tokens in 1/rate seconds
    in the gate's current mode; returns the mode of each step."""
    modes = []
    for _ in range(steps):
        modes.append(gate.open)
        clock.now += 1.0 / (on_rate if gate.open else off_rate)
        gate.step_done(True, running, running)
    return modes


def _runs(modes: list[bool]) -> list[tuple[bool, int]]:
    runs: list[tuple[bool, int]] = []
    for mode in modes:
        if runs and runs[-1][0] == mode:
            runs[-1] = (mode, runs[-1][1] + 1)
        else:
            runs.append((mode, 1))
    return runs


def test_slower_speculation_closes_the_gate_and_probes_ever_more_rarely() -> None:
    clock = _Clock()
    gate = SpeedGate(window=4, clock=clock)
    runs = _runs(_drive(gate, clock, 131, on_rate=50, off_rate=100))
    # On: the first result has no previous one to time, then a window of 4. Off: 2 settle steps, the probe's
    # window, then the decision (off) held 8 windows. Each probe of "on" (2 settle steps + a window) that
    # confirms "off" doubles the hold: 16 windows + 2 settle steps, then 32 ...
    assert runs == [(True, 5), (False, 2 + 4 + 32), (True, 6), (False, 2 + 64), (True, 6), (False, 10)]
    assert gate.num_closes == 1 and gate.num_probes == 3


def test_faster_speculation_keeps_the_gate_open() -> None:
    clock = _Clock()
    gate = SpeedGate(window=4, clock=clock)
    runs = _runs(_drive(gate, clock, 200, on_rate=100, off_rate=50))
    # Each probe of "off" (a window and the 2 steps planned before it) confirms "on": the hold doubles.
    assert runs == [(True, 5), (False, 6), (True, 2 + 64), (False, 6), (True, 117)]
    assert gate.num_closes == 0


def test_prefill_steps_and_a_changed_load_are_not_measured() -> None:
    clock = _Clock()
    gate = SpeedGate(window=4, clock=clock)
    for _ in range(40):  # slow steps, but each has a prefill chunk
        clock.now += 1.0
        gate.step_done(False, 8, 8)
    assert gate.open and gate.num_probes == 0
    for running in (8, 8, 8, 3, 3, 3):  # the load fell before the window filled: the window restarts
        clock.now += 0.01
        gate.step_done(True, running, running)
    assert gate.open and gate.num_probes == 0
    clock.now += 0.01
    gate.step_done(True, 3, 3)
    assert not gate.open and gate.num_probes == 1  # four steps at 3 running: the probe of "off" starts


def test_window_zero_never_closes() -> None:
    clock = _Clock()
    gate = SpeedGate(window=0, clock=clock)
    assert not gate.enabled
    assert all(_drive(gate, clock, 100, on_rate=1, off_rate=100))


def test_config_bound_names_the_field() -> None:
    with pytest.raises(ValueError, match="speed_check_window"):
        SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "speed_check_window": -1})


def test_a_closed_gate_plans_plain_steps_ahead_without_drafts() -> None:
    scheduler = Scheduler(make_config(speculative=SpeculativeConfig(method="mock-right", num_speculative_tokens=2)))
    worker = spec_tests.SpecWorker(4)
    scheduler.add_request(request("a", [1, 2, 3], max_tokens=10, ignore_eos=True))
    prefill = scheduler.schedule()
    scheduler.process_result(worker.execute(prefill))
    scheduler._speculation.gate.open = False
    first, second = scheduler.schedule(), scheduler.schedule()
    assert first is not None and second is not None  # two steps in flight: not lock-step
    for plan in (first, second):
        chunk = plan.scheduled[0]
        assert not chunk.draft_token_ids and not chunk.draft_after
    scheduler._speculation.gate.open = True
    for plan in (first, second):
        scheduler.process_result(worker.execute(plan))
    third = scheduler.schedule()
    assert third is not None and third.scheduled[0].draft_token_ids and third.scheduled[0].draft_after


@pytest.mark.parametrize("depth", [1, 2])
def test_tokens_and_accounting_are_unchanged_when_the_gate_flips(depth: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate toggled every third result, at any point of a verification: the outputs are the model's own."""
    flips = {"count": 0}

    def flipping_step_done(self: SpeedGate, decode_only: bool, num_running: int, num_tokens: int) -> None:
        flips["count"] += 1
        if flips["count"] % 3 == 0:
            self.open = not self.open

    monkeypatch.setattr(SpeedGate, "step_done", flipping_step_done)
    requests = [request("a", [5, 6, 7, 5, 6, 7, 5, 6], max_tokens=30, ignore_eos=True),
                request("c", list(range(4, 21)), max_tokens=25, ignore_eos=True)]
    outcomes, scheduler, _ = spec_tests.run(requests, "mock-one-right", depth)
    assert {rid: outcome.token_ids for rid, outcome in outcomes.items()} == spec_tests.expected(requests)
    assert flips["count"] > 6 and 0 < scheduler.stats().spec_decode_num_drafts


async def test_the_close_counter_is_exported(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.scheduler_stats = SchedulerStats(num_running=0, num_waiting=0, kv_blocks_used=0, kv_blocks_total=4,
                                            spec_decode_num_gate_closes=3)
    assert metric((await client.get("/metrics")).text, "rapid_llm:spec_decode_num_gate_closes_total") == 3
