"""How long an idle OpenMP thread of the engine's CPU children polls before it sleeps: libgomp's
GOMP_SPINCOUNT of 10,000 polls (0.12 ms on the AMX Xeon, 11.7 ns a poll) instead of its default 300,000 (3.5 ms).

After each parallel op the worker's other OpenMP threads poll for the next one. Inside a step, and between
steps sent back to back, the next op comes within tens of microseconds, which 0.12 ms still covers. After a
step followed by one-thread steps (a prefill before a small model's decodes) or by none, the default keeps a
core busy for 3.5 ms, and on a small CPU that is the core the scheduler, detokenizer and frontend need to pass
the step's tokens on: served llama-10m, 2 cores, a 128-token prompt's first token reached the scheduler 2-3 ms
after the worker sent it (docs/model_optimize_benchmarks.md, row 37). 3,000 polls (35 us) let threads fall
asleep between llama-100m's steps, and sleeping at once (OMP_WAIT_POLICY=passive) costs a futex wake per op (a
128-token llama-10m prefill step 5.2 -> 11.8 ms). libgomp reads the variable once, when a process loads it, so it
is set in the environment the children are spawned with; a user's GOMP_SPINCOUNT or OMP_WAIT_POLICY is kept.
Usage: `with openmp_spin_environment(config.device.type): ...start the children...`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

SPIN_COUNT = 10_000
_USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


@contextmanager
def openmp_spin_environment(device_type: str) -> Iterator[None]:
    """Within the block, processes spawned for a CPU engine get SPIN_COUNT; the launcher's environment is
    restored after it."""
    if device_type != "cpu" or any(name in os.environ for name in _USER_SETTINGS):
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    try:
        yield
    finally:
        os.environ.pop("GOMP_SPINCOUNT", None)
