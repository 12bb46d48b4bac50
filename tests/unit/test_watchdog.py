"""The scheduler's watchdog: a step unanswered for `watchdog_timeout` is logged, naming rank 0 and the step.

`StepWatchdog` alone on a fake clock, then the real `SchedulerLoop` (in a thread, over real ZeroMQ
sockets) against a fake worker that takes a plan and never answers.
"""

from __future__ import annotations

import logging
import time

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import GenerateRequest, SchedulerStats, StepPlan
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.watchdog import StepWatchdog
from tests.unit.scheduler_loop_harness import scheduler_loop


def test_the_watchdog_sets_no_timer_while_idle_and_reports_once_per_timeout(monkeypatch, caplog) -> None:
    now = [100.0]
    monkeypatch.setattr("rapid_llm.scheduler_proc.watchdog.time.monotonic", lambda: now[0])
    watchdog = StepWatchdog(timeout_s=5.0)
    assert watchdog.poll_timeout_ms(0) is None
    watchdog.progressed()
    now[0] += 2
    assert watchdog.poll_timeout_ms(2) == 3000
    assert not watchdog.check(7)
    now[0] += 3
    with caplog.at_level(logging.ERROR):
        assert watchdog.check(7)
        assert not watchdog.check(7), "reported once per timeout, not on every poll"
    assert "worker rank 0 has not answered step 7 for 5 s" in caplog.text
    now[0] += 5
    assert watchdog.check(7)
    watchdog.progressed()
    assert watchdog.poll_timeout_ms(1) == 5000 and not watchdog.check(8)


def test_the_scheduler_loop_logs_a_worker_that_stops_answering(caplog) -> None:
    config = SchedulerConfig(max_model_len=32, block_size=4, watchdog_timeout=0.2)
    with caplog.at_level(logging.ERROR, logger="rapid_llm.scheduler_proc.watchdog"), scheduler_loop(config) as loop:
        loop.requests.send(GenerateRequest("stuck", [1, 2, 3], SamplingParams(max_tokens=2)))
        assert loop.plans.socket.poll(10_000), "the scheduler sent no plan"
        assert isinstance(loop.plans.recv(), StepPlan)  # ... and the worker never answers it
        deadline = time.monotonic() + 10
        while "has not answered step 0" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "worker rank 0 has not answered step 0 for" in caplog.text
        loop.stop()
        assert loop.stopped and loop.thread is not None and not loop.thread.is_alive()
        last = None
        while (message := loop.stats.recv_nowait()) is not None:
            last = message
        assert isinstance(last, SchedulerStats) and (last.num_running, last.num_steps) == (1, 0)
