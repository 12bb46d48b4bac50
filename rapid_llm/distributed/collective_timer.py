"""Time this rank spends inside tensor-parallel collectives, measured, since the process started.

Key design choice: every collective in `parallel_state.py` runs inside `timed()`, which adds its wall time
to one per-process total. On the CPU (gloo) a collective returns when it is done, so that wall time is the
whole cost, including waiting for the slowest rank. On CUDA (NCCL) a collective only enqueues work, so the
totals stay zero unless RAPID_LLM_TIME_COLLECTIVES=1, which synchronizes the device before and after each one
(measurement only: it removes the overlap it measures, and CUDA graph replays bypass it; use
--enforce-eager). Rank 0 reports its totals with every step result; they reach /metrics as
`rapid_llm:collective_seconds` and `rapid_llm:collective_calls`. Under two-batch overlap
(micro_batch_overlap.py) only the exposed part is counted: issuing a collective and waiting for it, not the
other micro-batch's turn in between.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Iterator

import torch

from rapid_llm.distributed.timeline import record

_totals = {"seconds": 0.0, "calls": 0}
_SYNC_ENV = "RAPID_LLM_TIME_COLLECTIVES"


def _mode(device_type: str) -> str:
    if device_type != "cuda":
        return "wall"
    # A collective being captured into a CUDA graph runs later, at replay, where no timer sees it.
    if os.environ.get(_SYNC_ENV) != "1" or torch.cuda.is_current_stream_capturing():
        return "off"
    return "synchronized"


@contextmanager
def timed(device: torch.device, count: bool = True, name: str = "collective") -> Iterator[None]:
    """Add the wall time inside to the totals, and one call unless `count` is False (the wait of a call counted
    when it was issued); a started timeline (timeline.py) gets it as a span of `name`."""
    mode = _mode(device.type)
    if mode == "off":
        yield
        return
    if mode == "synchronized":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    yield
    if mode == "synchronized":
        torch.cuda.synchronize(device)
    end = time.perf_counter()
    _totals["seconds"] += end - start
    _totals["calls"] += count
    record("issue" if count else "wait", name, start, end)


def collective_totals() -> tuple[float, int]:
    """(seconds, calls) this process has spent in timed collectives."""
    return _totals["seconds"], int(_totals["calls"])
