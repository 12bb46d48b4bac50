"""A simulated cluster network on one host: every rank in a network namespace of its own, joined to a bridge by a
veth pair whose two ends are shaped by tc, so ranks talk over a link as slow as asked.

`Link(rate, delay_ms)`: the rate is `tc tbf` on both ends of each veth; the delay is `tc netem` where the kernel has
it, else (hosts without sch_netem, this project's CI machine among them) it is added inside each rank by
`delay_collectives`: a collective's work completes no earlier than `delay_ms` after it is issued, what a link latency
does to a message, and what overlap can hide. Root only; the namespaces hold loopback and the veths, nothing reaches
outside them, and they are removed on exit. Rendezvous over a file:// path works across namespaces (same files).
Usage:
    with SimulatedNetwork(2, Link("1gbit", 1.0)) as net:
        subprocess.Popen(net.command(rank, argv), env={**os.environ, **net.environment()})
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable

DELAY_ENV = "RAPID_LLM_BENCH_COLLECTIVE_DELAY_MS"
INTERFACE = "eth0"


@dataclass(frozen=True)
class Link:
    rate: str  # tc's spelling: "1gbit", "100mbit"
    delay_ms: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Link:
        """'1gbit:1.0' -> Link('1gbit', 1.0) (rate, then one-way delay in milliseconds)."""
        rate, _, delay = text.partition(":")
        return cls(rate, float(delay or 0))

    def __str__(self) -> str:
        return f"{self.rate}, {self.delay_ms:g} ms"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True)


class SimulatedNetwork:
    def __init__(self, ranks: int, link: Link, prefix: str = "rlsim") -> None:
        if os.geteuid() != 0:
            raise PermissionError("the simulated network creates network namespaces: run as root")
        self.ranks, self.link, self.prefix = ranks, link, prefix
        self.switch = f"{prefix}-sw"
        self.netem = False

    def namespace(self, rank: int) -> str:
        return f"{self.prefix}-r{rank}"

    def address(self, rank: int) -> str:
        return f"10.77.0.{rank + 1}"

    def _shape(self, namespace: str, device: str) -> None:
        if self.link.delay_ms:
            try:
                _run("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "netem", "delay",
                     f"{self.link.delay_ms}ms", "rate", self.link.rate)
                self.netem = True
                return
            except subprocess.CalledProcessError as error:
                if "unknown" not in error.stderr.lower():
                    raise
        _run("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", self.link.rate,
             "burst", "256kb", "latency", "100ms")

    def __enter__(self) -> SimulatedNetwork:
        self.close()  # a crashed earlier run's namespaces
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for rank in range(self.ranks):
            namespace, port = self.namespace(rank), f"p{rank}"
            _run("ip", "netns", "add", namespace)
            _run("ip", "-n", namespace, "link", "add", INTERFACE, "type", "veth", "peer", "name", port, "netns",
                 self.switch)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", namespace, "addr", "add", f"{self.address(rank)}/24", "dev", INTERFACE)
            _run("ip", "-n", namespace, "link", "set", "lo", "up")
            _run("ip", "-n", namespace, "link", "set", INTERFACE, "up")
            self._shape(namespace, INTERFACE)
            self._shape(self.switch, port)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for namespace in [self.switch, *(self.namespace(rank) for rank in range(self.ranks))]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)

    def command(self, rank: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(rank), *argv]

    def environment(self) -> dict[str, str]:
        """What a rank's process needs: gloo's interface, and the in-process delay when netem is missing."""
        delay = 0.0 if self.netem else self.link.delay_ms
        return {"GLOO_SOCKET_IFNAME": INTERFACE, DELAY_ENV: str(delay)}


class _DelayedWork:
    def __init__(self, work: Any, ready_at: float) -> None:
        self.work, self.ready_at = work, ready_at

    def wait(self, *args: Any) -> bool:
        if self.work is not None:
            self.work.wait(*args)
        remaining = self.ready_at - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return True

    def is_completed(self) -> bool:
        return time.perf_counter() >= self.ready_at and (self.work is None or self.work.is_completed())


def delay_collectives(names: tuple[str, ...] = ("all_reduce", "all_gather", "all_to_all_single",
                                                "all_gather_into_tensor", "broadcast"), module: Any = None) -> float:
    """In a rank: make `module`'s (torch.distributed's) `names` complete no earlier than the environment's delay
    after they are issued (blocking calls return then; async ones return work whose wait() does). Returns the delay
    (ms)."""
    if module is None:
        import torch.distributed as module

    delay_ms = float(os.environ.get(DELAY_ENV, "0") or 0)
    if not delay_ms:
        return 0.0

    def delayed(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, async_op: bool = False, **kwargs: Any) -> Any:
            work = _DelayedWork(original(*args, async_op=True, **kwargs), time.perf_counter() + delay_ms / 1000)
            if async_op:
                return work
            work.wait()
            return None
        return call

    for name in names:
        setattr(module, name, delayed(getattr(module, name)))
    return delay_ms
