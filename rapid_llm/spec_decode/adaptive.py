"""Adaptive off: a request whose drafts are rarely accepted stops drafting, and probes again later.

Per request, the acceptance over its last `acceptance_window` draft opportunities (decode steps where it could
draft): accepted / offered draft tokens, where a step on which the proposer found nothing counts its k
offered tokens as rejected -- such a step still runs lock-step (a speculating request is not planned ahead)
and gains nothing. Once the window is full and the rate is below `acceptance_threshold`, the request pauses:
it decodes plain tokens and, with async scheduling, overlaps its steps again. After `probe_after_tokens`
plain output tokens it drafts again with an empty window; each pause that follows a probe doubles the wait
(at most `_MAX_BACKOFF` times the base), a window that passes resets it. Torch-free, scheduler-side; the
state is keyed weakly by the request, so finished requests leave nothing behind.

Usage:
    adaptive = AdaptiveOff(config)
    if adaptive.may_draft(request): ...                   # before proposing
    adaptive.record_empty(requests, limits, proposals)     # after proposing: the steps without drafts
    adaptive.record(request, num_drafted, num_accepted)    # after each verification
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.spec_decode.proposer import Proposal

if TYPE_CHECKING:
    from rapid_llm.scheduler_proc.request_state import RequestState

_MAX_BACKOFF = 16  # the wait after a failed probe grows to at most 16 x probe_after_tokens


@dataclass
class _Track:
    window: deque[tuple[int, int]] = field(default_factory=deque)  # (drafted, accepted) per verification
    backoff: int = 1  # multiplier of probe_after_tokens for the next pause
    resume_at: int | None = None  # output count at which a paused request drafts again; None: not paused
    probing: bool = False  # drafting again after a pause, the window not yet full


class AdaptiveOff:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.threshold = config.acceptance_threshold
        self.window = config.acceptance_window
        self.probe_after = config.probe_after_tokens
        self._tracks: weakref.WeakKeyDictionary[RequestState, _Track] = weakref.WeakKeyDictionary()
        self.num_disables = 0  # pauses (a request's acceptance fell below the threshold)
        self.num_probes = 0  # paused requests that drafted again

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def may_draft(self, request: RequestState) -> bool:
        """Whether the request may be offered drafts now; a paused request whose wait is over resumes here."""
        track = self._tracks.get(request)
        if track is None or track.resume_at is None:
            return True
        if request.num_output_tokens < track.resume_at:
            return False
        track.resume_at = None
        track.probing = True
        request.speculates = True
        self.num_probes += 1
        return True

    def record_empty(self, requests: Sequence[RequestState], limits: Sequence[int],
                     proposals: Sequence[Proposal]) -> None:
        """Count each request the proposer offered no draft as `limit` drafted tokens, none accepted."""
        for request, limit, proposal in zip(requests, limits, proposals):
            if not proposal.token_ids:
                self.record(request, limit, 0)

    def record(self, request: RequestState, num_drafted: int, num_accepted: int) -> None:
        """Count one draft opportunity; pause the request when its windowed acceptance is below the threshold."""
        if not self.enabled or num_drafted == 0:
            return
        track = self._tracks.get(request)
        if track is None:
            track = self._tracks[request] = _Track()
        track.window.append((num_drafted, num_accepted))
        if len(track.window) > self.window:
            track.window.popleft()
        if len(track.window) < self.window:
            return
        drafted = sum(entry[0] for entry in track.window)
        accepted = sum(entry[1] for entry in track.window)
        if accepted >= self.threshold * drafted:
            track.backoff = 1
            track.probing = False
            return
        if track.probing:
            track.backoff = min(2 * track.backoff, _MAX_BACKOFF)
        track.probing = False
        track.window.clear()
        # num_output_tokens counts every token of the steps so far, a verification's placeholders included.
        track.resume_at = request.num_output_tokens + track.backoff * self.probe_after
        # Not speculating lets the scheduler plan the request's steps ahead again (async scheduling).
        request.speculates = False
        self.num_disables += 1
