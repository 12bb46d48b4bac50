"""A torch.profiler window over the worker's steps: does the host's work hide behind the GPU's?

Set `RAPID_LLM_TORCH_PROFILER_DIR` (like vLLM's VLLM_TORCH_PROFILER_DIR) and each worker rank skips the first
SKIP steps that execute a plan (start-up, first-use compilation), records the next COUNT
(`RAPID_LLM_PROFILE_STEPS`, "SKIP:COUNT", default "100:64"), then stops and writes one gzip chrome trace,
`worker-rank{rank}.json.gz` (`worker-dp{replica}-rank{rank}.json.gz` with data parallelism), to that directory.
A worker that stops before the window ends writes nothing. Each step is a "worker_step" range on the host
timeline (launching the plan and sending the result it overlapped with); benchmarks/gpu/step_gaps.py lines those
up with the device's kernels. Key design choice: the variables are read once, at start-up, and without them
there is no profiler object at all, so the process loop pays one None check per step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile, record_function

logger = logging.getLogger(__name__)

PROFILER_DIR_ENV = "RAPID_LLM_TORCH_PROFILER_DIR"
PROFILE_STEPS_ENV = "RAPID_LLM_PROFILE_STEPS"
DEFAULT_PROFILE_STEPS = "100:64"
STEP_RANGE = "worker_step"  # the range name benchmarks/gpu/step_gaps.py looks for


class ProfileWindow(NamedTuple):
    skip: int  # steps executed before recording starts
    count: int  # steps recorded


def parse_profile_steps(text: str) -> ProfileWindow:
    """`RAPID_LLM_PROFILE_STEPS`: "SKIP:COUNT" with SKIP >= 0 and COUNT >= 1."""
    skip, _, count = text.partition(":")
    if skip.isdecimal() and count.isdecimal() and int(count) > 0:
        return ProfileWindow(int(skip), int(count))
    raise ValueError(f"{PROFILE_STEPS_ENV}={text!r}: expected SKIP:COUNT, e.g. {DEFAULT_PROFILE_STEPS!r} "
                     "(skip SKIP >= 0 worker steps, then record COUNT >= 1)")


class StepProfiler:
    """Counts the steps that execute a plan and records steps [skip, skip + count) of them."""

    def __init__(self, trace_path: Path, window: ProfileWindow) -> None:
        self.trace_path = trace_path
        self.window = window
        self.steps = 0
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._profile: profile | None = profile(activities=activities)  # None once the trace is written

    @contextmanager
    def step(self) -> Iterator[None]:
        """Wraps one step that executes a plan."""
        index = self.steps
        self.steps += 1
        if self._profile is None or index < self.window.skip:
            yield
            return
        if index == self.window.skip:
            self._profile.start()
        with record_function(STEP_RANGE):
            yield
        if index == self.window.skip + self.window.count - 1:
            self._write(self._profile)

    def _write(self, active: profile) -> None:
        """Stops recording and writes the trace (once: later steps find no profiler)."""
        self._profile = None
        active.stop()
        try:
            active.export_chrome_trace(str(self.trace_path))  # a ".gz" name makes torch gzip it
        except OSError:
            # A diagnostic that cannot be written must not stop the server.
            logger.exception("could not write the step profile to %s", self.trace_path)
            return
        logger.info("step profile of %d worker steps (after %d) written to %s", self.window.count,
                    self.window.skip, self.trace_path)


def step_profiler_from_env(rank: int, replica: int | None = None,
                           environ: Mapping[str, str] = os.environ) -> StepProfiler | None:
    """The profiler the environment asks for; None when `RAPID_LLM_TORCH_PROFILER_DIR` is unset or empty.
    `replica`: the data-parallel replica, named in the file when there are several (they share rank numbers)."""
    directory = environ.get(PROFILER_DIR_ENV)
    if not directory:
        return None
    window = parse_profile_steps(environ.get(PROFILE_STEPS_ENV, DEFAULT_PROFILE_STEPS))
    try:
        # Now rather than after the window, so a directory that cannot exist fails the start-up.
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{PROFILER_DIR_ENV}={directory!r}: cannot create the directory ({error})") from error
    name = f"worker-rank{rank}" if replica is None else f"worker-dp{replica}-rank{rank}"
    return StepProfiler(Path(directory) / f"{name}.json.gz", window)
