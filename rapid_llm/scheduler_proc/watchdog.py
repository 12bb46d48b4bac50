"""StepWatchdog: notices a worker that has not answered a step for `timeout_s` seconds.

The worker runs steps in order, so the oldest step in flight has been awaited since it was sent
into an idle pipeline or since the previous result arrived, whichever is later. The scheduler loop
polls with `poll_timeout_ms()` -- a timeout only while steps are in flight, so an idle scheduler
still blocks without a timer -- and calls `check()` when the poll came back empty.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)


class StepWatchdog:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._awaited_since = time.monotonic()
        self._next_report = self._awaited_since + timeout_s

    def progressed(self) -> None:
        """A result arrived, or a step went out while none was in flight: the oldest step is new."""
        self._awaited_since = time.monotonic()
        self._next_report = self._awaited_since + self.timeout_s

    def poll_timeout_ms(self, num_inflight_steps: int) -> int | None:
        """How long the loop may block: forever when idle, else until the next report is due."""
        if num_inflight_steps == 0:
            return None
        return max(0, round((self._next_report - time.monotonic()) * 1000))

    def check(self, oldest_step_id: int) -> bool:
        """Log (once per `timeout_s`) when the oldest step is overdue; returns whether it is."""
        now = time.monotonic()
        if now < self._next_report:
            return False
        logger.error("worker rank 0 has not answered step %d for %.0f s (--watchdog-timeout %g s)",
                     oldest_step_id, now - self._awaited_since, self.timeout_s)
        self._next_report = now + self.timeout_s
        return True
