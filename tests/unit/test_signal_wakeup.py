"""An engine child blocked in `Receiver.recv` exits on SIGTERM even when another thread catches the signal."""

from __future__ import annotations

import multiprocessing
import signal
import tempfile
import threading
import time

import zmq

from rapid_llm.ipc.messages import StepPlan
from rapid_llm.ipc.sockets import Receiver
from rapid_llm.utils.process import configure_child


def _blocked_child(address: str) -> None:
    configure_child("warning")
    receiver = Receiver(zmq.Context(), address, StepPlan)

    def signal_this_thread() -> None:
        time.sleep(0.3)
        # The kernel may hand a process-directed signal to any thread; this makes it a helper thread.
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(60)

    threading.Thread(target=signal_this_thread, daemon=True).start()
    receiver.recv()  # nothing is ever sent


def test_sigterm_caught_by_another_thread_wakes_a_blocking_recv() -> None:
    with tempfile.TemporaryDirectory() as directory:
        child = multiprocessing.get_context("spawn").Process(target=_blocked_child, args=(f"ipc://{directory}/s",))
        child.start()
        child.join(20)
        alive = child.is_alive()
        if alive:
            child.kill()
            child.join()
    assert not alive, "the child slept through SIGTERM"
    assert child.exitcode == 0
