"""A timeline of this process's collectives and two-batch-overlap turns, for benchmarks and traces: off unless
started, one list append per span when on.

torch.profiler records only the thread that started it, and two-batch overlap computes on two pool threads, so
the overlap's evidence is kept here instead: the collective timer adds a span per issue and per wait (named by the
collective), the micro-batch executor one per turn a micro-batch holds the baton. `chrome_trace` writes them as
Chrome trace events (one row per thread), which Perfetto and chrome://tracing open.
Usage: `start_timeline()`; run steps; `spans = stop_timeline()`; `chrome_trace(spans, path)`.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator


@dataclass(frozen=True)
class Span:
    kind: str  # "issue", "wait" (a collective's exposed parts) or "turn" (a micro-batch computing)
    name: str  # the collective ("all_reduce", "all_to_all", ...) or the micro-batch ("micro-batch 0")
    thread: str
    start: float  # time.perf_counter() seconds
    end: float


_spans: list[Span] | None = None


def start_timeline() -> None:
    global _spans
    _spans = []


def stop_timeline() -> list[Span]:
    global _spans
    spans, _spans = _spans or [], None
    return spans


def record(kind: str, name: str, start: float, end: float) -> None:
    if _spans is not None:
        _spans.append(Span(kind, name, threading.current_thread().name, start, end))


@contextmanager
def span(kind: str, name: str) -> Iterator[None]:
    if _spans is None:
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        record(kind, name, start, time.perf_counter())


def chrome_trace(spans: list[Span], path: str | Path) -> None:
    origin = min((item.start for item in spans), default=0.0)
    events = [{"name": f"{item.kind} {item.name}", "ph": "X", "pid": 0, "tid": item.thread, "cat": item.kind,
               "ts": (item.start - origin) * 1e6, "dur": (item.end - item.start) * 1e6} for item in spans]
    Path(path).write_text(json.dumps({"traceEvents": events, "spans": [asdict(item) for item in spans]}))
