"""Speed gate: batch-level adaptive off -- speculation stays on only while it measurably speeds decoding up.

Acceptance (`adaptive.py`) cannot see what drafting costs: a draft accepted at 0.5 can still make a step
dearer than the tokens it saves (a CPU, where a decode step is not memory-bound). The gate measures output
tokens per second over windows of `window` decode-only steps: prefill steps and the first results after a
switch are not counted, and a change of the running-request count by more than a quarter restarts the window
(not a step's rows: under async scheduling lock-step speculating rows and planned-ahead plain ones alternate).
One window on, one off (a probe); the faster mode is held for `_HOLD` windows, then the other is probed. A
decision that repeats the last doubles the hold (up to `_MAX_BACKOFF` times), a reversal resets it. While
closed nobody drafts or waits lock-step. Torch-free; the clock is injectable (tests).

Usage:
    gate = SpeedGate(window=64)
    if gate.open: ...                                     # may requests draft in the next plan
    gate.step_done(decode_only, num_running, num_tokens)  # once per step result
"""

from __future__ import annotations

import logging
import time
from typing import Callable

logger = logging.getLogger(__name__)

_HOLD = 8  # windows a decision holds before the other mode is probed again (times the backoff)
_MAX_BACKOFF = 32
_SETTLE_STEPS = 2  # results after a switch that were planned (async: one step ahead) before it


class SpeedGate:
    def __init__(self, window: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self.open = True
        self._held = True  # the mode chosen by the last decision (the first: speculation on, unmeasured)
        self._probing = False
        self._windows_left = 1  # windows to run in the current mode before the next comparison
        self._backoff = 1
        self._rates: dict[bool, float | None] = {True: None, False: None}
        self._last_result: float | None = None
        self._settle = 0
        self._reset_window()
        self.num_closes = 0  # decisions that turned speculation off
        self.num_probes = 0  # windows run in the mode not held

    @property
    def enabled(self) -> bool:
        return self.window > 0

    def _reset_window(self) -> None:
        self._steps, self._tokens, self._seconds, self._running = 0, 0, 0.0, 0

    def step_done(self, decode_only: bool, num_running: int, num_tokens: int) -> None:
        """Count one step's result: `num_tokens` output tokens, `num_running` requests running after it."""
        now = self._clock()
        elapsed = None if self._last_result is None else now - self._last_result
        self._last_result = now
        if not self.enabled:
            return
        if self._settle:
            self._settle -= 1
            return
        if not decode_only or elapsed is None or num_running == 0:
            return
        if self._steps and abs(num_running - self._running) * 4 > self._running:
            self._reset_window()  # the load changed: rates at different loads do not compare
        if not self._steps:
            self._running = num_running
        self._steps += 1
        self._tokens += num_tokens
        self._seconds += elapsed
        if self._steps >= self.window:
            rate = self._tokens / self._seconds if self._seconds > 0 else 0.0
            self._reset_window()
            self._window_done(rate)

    def _window_done(self, rate: float) -> None:
        self._rates[self.open] = rate
        if self._probing:
            faster = bool(self._rates[True] >= self._rates[False])
            self._backoff = min(2 * self._backoff, _MAX_BACKOFF) if faster == self._held else 1
            if not faster and self._held:
                self.num_closes += 1
            self._held, self._probing = faster, False
            self._windows_left = _HOLD * self._backoff
            logger.info("speed gate: %.0f output tok/s with speculation, %.0f without: speculation %s for %d "
                        "windows", self._rates[True], self._rates[False], "on" if faster else "off",
                        self._windows_left)
            self._switch(faster)
            return
        self._windows_left -= 1
        if self._windows_left <= 0:
            self._probing = True
            self.num_probes += 1
            self._switch(not self._held)

    def _switch(self, mode: bool) -> None:
        if mode != self.open:
            self.open = mode
            self._settle = _SETTLE_STEPS
