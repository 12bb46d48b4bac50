"""The router's view of its instances: one pool per role, a choice per request, counters per instance.

A pool picks round robin or the instance with the fewest requests in flight through this router (`least_load`,
ties in round-robin order). Key design choice: load is what this router sent and has not seen end, not the
instances' own metrics: it is exact for traffic that comes through the router and needs no polling.
Usage: `pool = InstancePool("prefill", urls, "least_load")`; `with pool.choose() as instance: ...`.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

POLICIES = ("round_robin", "least_load")


@dataclass(eq=False)
class Instance:
    url: str
    role: str
    in_flight: int = 0
    requests: int = 0  # sent, since start
    failures: int = 0  # connection errors and 5xx answers, since start


class InstancePool:
    def __init__(self, role: str, urls: list[str], policy: str) -> None:
        if not urls:
            raise ValueError(f"the router needs at least one {role} instance")
        if policy not in POLICIES:
            raise ValueError(f"--policy {policy!r} must be one of {', '.join(POLICIES)}")
        self.instances = [Instance(url.rstrip("/"), role) for url in urls]
        self._policy = policy
        self._turn = itertools.count()

    @contextmanager
    def choose(self) -> Iterator[Instance]:
        """The instance for one request, counted in flight until the block ends."""
        start = next(self._turn) % len(self.instances)
        order = self.instances[start:] + self.instances[:start]
        instance = order[0] if self._policy == "round_robin" else min(order, key=lambda item: item.in_flight)
        instance.in_flight += 1
        instance.requests += 1
        try:
            yield instance
        finally:
            instance.in_flight -= 1
