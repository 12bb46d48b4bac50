"""The real `SchedulerLoop` in a thread over real ZeroMQ sockets, with the test playing frontend and worker.

Usage: `with scheduler_loop(config) as loop: loop.requests.send(...); plan = loop.plans.recv()`; the loop is
stopped (a WorkerFailed from the fake worker) and every socket closed on exit; `loop.stopped` holds the error
it stopped with.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Iterator

import zmq

from rapid_llm.config.scheduler_config import SchedulerConfig
from rapid_llm.ipc.messages import SchedulerToFrontend, SchedulerToWorker, TokenBatch, WorkerFailed, WorkerReady
from rapid_llm.ipc.sockets import IpcPaths, Receiver, Sender
from rapid_llm.scheduler_proc.process import SchedulerLoop, WorkerFailedError


@dataclass
class LoopUnderTest:
    plans: Receiver
    stats: Receiver
    results: Sender
    requests: Sender
    thread: threading.Thread | None = None
    stopped: list[BaseException] = field(default_factory=list)

    def stop(self) -> None:
        """The fake worker fails; the loop ends (WorkerFailedError) and its thread with it."""
        self.results.send(WorkerFailed(error="test over"))
        if self.thread is not None:
            self.thread.join(10)


@contextlib.contextmanager
def scheduler_loop(config: SchedulerConfig, num_kv_blocks: int = 16) -> Iterator[LoopUnderTest]:
    paths = IpcPaths.create(1)
    context = zmq.Context()
    loops: list[SchedulerLoop] = []
    try:
        under_test = LoopUnderTest(Receiver(context, paths.scheduler_to_workers[0], SchedulerToWorker),
                                   Receiver(context, paths.scheduler_to_frontend, SchedulerToFrontend),
                                   Sender(context, paths.worker_to_scheduler),
                                   Sender(context, paths.frontend_to_scheduler))
        Receiver(context, paths.scheduler_to_detokenizer, TokenBatch)
        under_test.results.send(WorkerReady(num_kv_blocks=num_kv_blocks))

        def run_loop() -> None:
            loops.append(SchedulerLoop(config, paths))
            try:
                loops[0].run()
            except WorkerFailedError as error:
                under_test.stopped.append(error)

        under_test.thread = threading.Thread(target=run_loop, daemon=True)
        under_test.thread.start()
        yield under_test
    finally:
        # The loop's own context too: left to the garbage collector, its unsent messages would block it.
        for loop in loops:
            loop.requests.socket.context.destroy(linger=0)
        context.destroy(linger=0)
        paths.remove()
