"""The server's resources during a benchmark run: RSS and CPU per process, GPU memory and utilisation.

Key design choice: processes are read from /proc (Linux; psutil is not a dependency) and GPUs from NVML
(pynvml, when installed) or else `nvidia-smi --query-*`; whatever cannot be measured is reported as
`{"unavailable": reason}`, never estimated. The server is the process listening on the benchmark's port
(found through /proc/net/tcp{,6} and the processes' socket fds, so it works for any server run by this
user on this machine) or `--server-pid`, plus every descendant, re-listed at each sample so children
started late count too. CPU % is of one core, as `top` shows it (200 = two cores busy).

    sampler = ResourceSampler(server_pids(port=30000), interval_s=0.5)
    with sampler: ...  # the run
    resources = sampler.summary()
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.common.gpu_sampling import open_gpu_reader
from benchmarks.common.metrics import table_header, table_row

PROC = Path("/proc")
MIB = 2**20
_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TITLE_CHARS = 200
# A process title in the printed table; the JSON keeps it whole.
_SHORT_TITLE_CHARS = 22


def server_pids(port: int | None = None, pid: int | None = None) -> tuple[list[int], str | None]:
    """(root pids of the server, None) -- `pid` when given, else the processes listening on `port` whose
    parent does not listen too -- or ([], why none was found)."""
    if not PROC.is_dir():
        return [], "no /proc on this system (the sampler reads Linux's /proc)"
    if pid is not None:
        if not (PROC / str(pid)).is_dir():
            return [], f"--server-pid {pid} is not a running process"
        return [pid], None
    inodes = _listening_inodes(port)
    if not inodes:
        return [], f"no process on this machine listens on port {port} (a remote server? pass --server-pid)"
    holders = {pid for pid in _all_pids() if inodes & _socket_inodes(pid)}
    if not holders:
        return [], f"the socket listening on port {port} belongs to no process this user can inspect"
    parents = {pid: _parent(pid) for pid in holders}
    return sorted(pid for pid in holders if parents[pid] not in holders), None


@dataclass
class _ProcessSeries:
    title: str
    rss_bytes: list[int] = field(default_factory=list)
    cpu_percent: list[float] = field(default_factory=list)
    # (time, cpu seconds) of the first and the latest sample: the run's mean CPU is their slope.
    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None


class ResourceSampler:
    """Samples the server's process tree (and GPUs) every `interval_s` in a child process, plus once at start
    and once at stop, so every process seen has a CPU figure however short the run. A child, not a thread:
    a sampler thread holding the load generator's GIL while it reads /proc cost ~9 % of the measured
    throughput on a 2-core machine (llama-10m, concurrency 8, 4 interleaved pairs)."""

    def __init__(self, roots: list[int], interval_s: float = 0.5, unavailable: str | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"--resource-interval must be positive, got {interval_s}")
        self.roots = roots
        self.interval_s = interval_s
        self.unavailable = unavailable or (None if roots else "no server process given")
        self._summary: dict[str, Any] | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def __enter__(self) -> "ResourceSampler":
        if self.unavailable is None:
            # fork: /proc is Linux-only anyway, and the child starts in milliseconds with the parent's imports.
            context = multiprocessing.get_context("fork")
            self._conn, child_conn = context.Pipe()
            self._process = context.Process(target=_sample_until_stopped, args=(child_conn, self.roots, self.interval_s),
                                            name="resource-sampler", daemon=True)
            self._process.start()
            self._conn.recv()  # the first sample is taken
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._conn is not None:
            self._conn.send("stop")
            self._summary = self._conn.recv()
            self._process.join()
            self._process = self._conn = None

    def summary(self) -> dict[str, Any]:
        """The `resources` block of the result: per process peak/mean RSS (MiB), mean/peak CPU %, samples."""
        if self.unavailable is not None:
            return {"unavailable": self.unavailable}
        if self._summary is None:
            raise RuntimeError("summary() before the sampled run ended")
        return self._summary


def _sample_until_stopped(conn: Connection, roots: list[int], interval_s: float) -> None:
    """The sampler child: sample now, then every `interval_s` until told to stop; send the summary back."""
    sampling = _Sampling(roots, interval_s)
    sampling.sample()
    conn.send("started")
    while not conn.poll(interval_s):
        sampling.sample()
    conn.recv()
    sampling.sample()
    conn.send(sampling.summary())
    sampling.close()


class _Sampling:
    """The sampled series of one run (lives in the sampler child)."""

    def __init__(self, roots: list[int], interval_s: float) -> None:
        self.roots = roots
        self.interval_s = interval_s
        self.samples = 0
        self._series: dict[int, _ProcessSeries] = {}
        self._totals_rss: list[int] = []
        self._gpu, self._gpu_unavailable = open_gpu_reader()

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()

    def sample(self) -> None:
        now = time.perf_counter()
        total_rss = 0
        for pid in _tree(self.roots):
            stat = _read_stat(pid)
            if stat is None:  # exited between listing and reading
                continue
            cpu_s, rss_bytes = stat
            series = self._series.setdefault(pid, _ProcessSeries(_title(pid)))
            if series.last is not None and now > series.last[0]:
                series.cpu_percent.append(100.0 * (cpu_s - series.last[1]) / (now - series.last[0]))
            series.first = series.first or (now, cpu_s)
            series.last = (now, cpu_s)
            series.rss_bytes.append(rss_bytes)
            total_rss += rss_bytes
        self._totals_rss.append(total_rss)
        if self._gpu is not None:
            self._gpu.sample(set(self._series))
        self.samples += 1

    def summary(self) -> dict[str, Any]:
        processes = [_process_summary(pid, series) for pid, series in sorted(self._series.items())]
        gpu = self._gpu.summary() if self._gpu is not None else {"unavailable": self._gpu_unavailable}
        for process in processes:
            if "per_process_mib_peak" in gpu:
                process["gpu_memory_mib_peak"] = gpu["per_process_mib_peak"].get(process["pid"], 0.0)
        return {
            "source": "/proc",
            "interval_s": self.interval_s,
            "samples": self.samples,
            "server_pids": self.roots,
            "processes": processes,
            "total": {
                "rss_mib_peak": max(self._totals_rss, default=0) / MIB,
                "cpu_percent_mean": sum(p["cpu_percent_mean"] or 0.0 for p in processes),
            },
            "gpu": {k: v for k, v in gpu.items() if k != "per_process_mib_peak"},
        }


def _process_summary(pid: int, series: _ProcessSeries) -> dict[str, Any]:
    mean_cpu = None
    if series.first and series.last and series.last[0] > series.first[0]:
        mean_cpu = 100.0 * (series.last[1] - series.first[1]) / (series.last[0] - series.first[0])
    return {
        "pid": pid,
        "title": series.title,
        "samples": len(series.rss_bytes),
        "rss_mib_peak": max(series.rss_bytes) / MIB,
        "rss_mib_mean": sum(series.rss_bytes) / len(series.rss_bytes) / MIB,
        # None for a process seen in one sample only: no interval to measure over.
        "cpu_percent_mean": mean_cpu,
        "cpu_percent_peak": max(series.cpu_percent, default=None),
    }


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def _listening_inodes(port: int | None) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    try:
        fds = list((PROC / str(pid) / "fd").iterdir())
    except OSError:  # another user's process, or gone
        return set()
    inodes = set()
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses); None if gone."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _read_stat(pid: int) -> tuple[float, int] | None:
    """(user + system CPU seconds, resident bytes) of a process."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, int(fields[21]) * _PAGE_SIZE


def _tree(roots: list[int]) -> list[int]:
    """`roots` and all their living descendants."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        parent = _parent(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found, pending = [], [pid for pid in roots if (PROC / str(pid)).is_dir()]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def _title(pid: int) -> str:
    """What `ps` shows: the command line (setproctitle's `rapid_llm::scheduler`), else the command name."""
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        return (cmdline or (PROC / str(pid) / "comm").read_text().strip())[:_TITLE_CHARS]
    except OSError:
        return f"pid {pid}"


def format_resources(resources: dict[str, Any]) -> str:
    """The printed resources section: peak RSS and mean CPU per process, then the GPUs."""
    lines = [table_header(" Server Resources ", "=")]
    if "unavailable" in resources:
        return "\n".join([*lines, f"unavailable: {resources['unavailable']}"])
    lines.append(table_row(f"Samples (every {resources['interval_s']} s):", resources["samples"]))
    for process in resources["processes"]:
        title = process["title"][:_SHORT_TITLE_CHARS]
        lines.append(table_row(f"{title} peak RSS (MiB):", process["rss_mib_peak"], ".1f"))
        cpu = process["cpu_percent_mean"]
        lines.append(table_row(f"{title} mean CPU (%):", "n/a" if cpu is None else f"{cpu:.1f}"))
    lines.append(table_row("All processes peak RSS (MiB):", resources["total"]["rss_mib_peak"], ".1f"))
    lines.append(table_row("All processes mean CPU (%):", resources["total"]["cpu_percent_mean"], ".1f"))
    gpu = resources["gpu"]
    if "unavailable" in gpu:
        lines.append(f"GPU: unavailable: {gpu['unavailable']}")
        return "\n".join(lines)
    for device in gpu["devices"]:
        lines.append(table_row(f"GPU {device['index']} peak memory used (MiB):", device["memory_used_mib_peak"], ".1f"))
        lines.append(table_row(f"GPU {device['index']} mean utilisation (%):", device["utilization_percent_mean"],
                               ".1f"))
    lines.append(table_row("Server GPU memory peak (MiB):", gpu["server_memory_mib_peak"], ".1f"))
    return "\n".join(lines)
