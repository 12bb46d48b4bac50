"""The scheduler's watchdog: a step unanswered for `watchdog_timeout` is logged, naming rank 0 and the step.

`StepWatchdog` alone on a fake clock, then the real `SchedulerLoop` (in a thread, over real ZeroMQ
sockets) against a fake worker that takes a plan and never answers.
"""

from __future__ import annotations

import logging
import threading
import time

import zmq

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import (
    GenerateRequest,
    SchedulerStats,
    SchedulerToFrontend,
    SchedulerToWorker,
    StepPlan,
    TokenBatch,
    WorkerFailed,
    WorkerReady,
)
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.process import SchedulerLoop, WorkerFailedError
from rapid_llm.scheduler_proc.watchdog import StepWatchdog


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
    paths = IpcPaths.create(1)
    context = zmq.Context()
    loops: list[SchedulerLoop] = []
    try:
        plans: Receiver = Receiver(context, paths.scheduler_to_workers[0], SchedulerToWorker)
        stats: Receiver = Receiver(context, paths.scheduler_to_frontend, SchedulerToFrontend)
        Receiver(context, paths.scheduler_to_detokenizer, TokenBatch)
        results = Sender(context, paths.worker_to_scheduler)
        requests = Sender(context, paths.frontend_to_scheduler)
        results.send(WorkerReady(num_kv_blocks=16))
        config = SchedulerConfig(max_model_len=32, block_size=4, watchdog_timeout=0.2)
        stopped: list[BaseException] = []

        def run_loop() -> None:
            loops.append(SchedulerLoop(config, paths))
            try:
                loops[0].run()
            except WorkerFailedError as error:
                stopped.append(error)

        with caplog.at_level(logging.ERROR, logger="rapid_llm.scheduler_proc.watchdog"):
            thread = threading.Thread(target=run_loop, daemon=True)
            thread.start()
            requests.send(GenerateRequest("stuck", [1, 2, 3], SamplingParams(max_tokens=2)))
            assert plans.socket.poll(10_000), "the scheduler sent no plan"
            assert isinstance(plans.recv(), StepPlan)  # ... and the worker never answers it
            deadline = time.monotonic() + 10
            while "has not answered step 0" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "worker rank 0 has not answered step 0 for" in caplog.text
            results.send(WorkerFailed(error="test over"))
            thread.join(10)
        assert stopped and not thread.is_alive()
        last = None
        while (message := stats.recv_nowait()) is not None:
            last = message
        assert isinstance(last, SchedulerStats) and (last.num_running, last.num_steps) == (1, 0)
    finally:
        # The loop's own context too: left to the garbage collector, its unsent messages would block it.
        for loop in loops:
            loop.requests.socket.context.destroy(linger=0)
        context.destroy(linger=0)
        paths.remove()
