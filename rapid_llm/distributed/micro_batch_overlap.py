"""Two-batch overlap's executor: two micro-batch forwards on two threads, one running at a time, switching at every
collective, so one micro-batch's communication is in flight while the other computes.

Key design choice: a baton handed over at collectives (the shape of vLLM's DBO), not a model rewritten into stages:
every tensor-parallel and expert-parallel collective goes through `run_collective`, which starts it asynchronously,
hands the baton to the other micro-batch and waits for its own work only when the baton comes back. The issue order
is fixed (A's first collective, B's first, A's second, ...) and the same on every rank, as gloo and NCCL need;
only the baton holder runs Python or torch ops, so compute never competes with itself while the collectives make
progress on the backend's threads (gloo) or stream (NCCL). Outside `run_two` a collective blocks as before.
The collective timer (collective_timer.py) counts the exposed part only: issuing and waiting, not the other
micro-batch's turn; a started timeline (timeline.py) gets every turn as a span.
Usage: `first, second = run_two([lambda: model(batch_a), lambda: model(batch_b)], device)`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Protocol, Sequence

import torch

from rapid_llm.distributed.collective_timer import timed
from rapid_llm.distributed.timeline import record


class Work(Protocol):
    def wait(self) -> Any: ...


class _Baton:
    """Which of two micro-batches may run; a finished one hands it over for good."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.turn = 0
        self.finished = [False, False]

    def wait_turn(self, index: int) -> None:
        with self.condition:
            self.condition.wait_for(lambda: self.turn == index)

    def hand_over(self, index: int) -> None:
        """Let the other micro-batch run until it hands back (at once when it has finished)."""
        with self.condition:
            if self.finished[1 - index]:
                return
            self.turn = 1 - index
            self.condition.notify_all()
            self.condition.wait_for(lambda: self.turn == index)

    def finish(self, index: int) -> None:
        with self.condition:
            self.finished[index] = True
            self.turn = 1 - index
            self.condition.notify_all()


_local = threading.local()
_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="micro-batch")


def run_collective(device: torch.device, name: str, start: Callable[[bool], Work | None]) -> None:
    """Run the collective `name`: `start(async_op)` issues it. Inside a micro-batch it is issued asynchronously and
    the other micro-batch runs before this one waits for it; elsewhere it blocks."""
    baton: _Baton | None = getattr(_local, "baton", None)
    if baton is None:
        with timed(device, name=name):
            start(False)
        return
    with timed(device, name=name):
        work = start(True)
    turn_end = time.perf_counter()
    record("turn", f"micro-batch {_local.index}", _local.turn_start, turn_end)
    baton.hand_over(_local.index)
    _local.turn_start = time.perf_counter()
    if work is not None:
        with timed(device, count=False, name=name):
            work.wait()


def _run_micro_batch(baton: _Baton, index: int, forward: Callable[[], torch.Tensor], threads: int,
                     device: torch.device) -> torch.Tensor:
    baton.wait_turn(index)
    _local.baton, _local.index, _local.turn_start = baton, index, time.perf_counter()
    try:
        # Grad mode and the intra-op thread count are per thread: the step's, not the pool thread's defaults.
        torch.set_num_threads(threads)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        with torch.inference_mode():
            return forward()
    finally:
        _local.baton = None
        record("turn", f"micro-batch {index}", _local.turn_start, time.perf_counter())
        baton.finish(index)


def run_two(forwards: Sequence[Callable[[], torch.Tensor]], device: torch.device) -> list[torch.Tensor]:
    """Both forwards' results, run interleaved at their collectives (the first starts)."""
    if len(forwards) != 2:
        raise ValueError(f"two-batch overlap runs two micro-batches, got {len(forwards)}")
    baton = _Baton()
    threads = torch.get_num_threads()
    futures = [_pool.submit(_run_micro_batch, baton, index, forward, threads, device)
               for index, forward in enumerate(forwards)]
    return [future.result() for future in futures]
