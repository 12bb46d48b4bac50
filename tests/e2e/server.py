"""Start the real server as a subprocess for end-to-end tests, and inspect what it leaves behind.

The server's output goes to a temporary file that `stop()` reads back and deletes, so test runs
leave no log files behind while `log()` still returns everything the server printed.
"""

from __future__ import annotations

import glob
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing is bound to, below the kernel's ephemeral range and never the same twice in one test process.
    A port from bind(0) lies in that range, where an engine's own outgoing connections and gloo's sockets take
    theirs, so one of them could grab it before the server under test binds it (a CI run failed so)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(10000, low), 200):
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in [10000, {low}) after 200 tries")


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.split("/")[2]))
    return children


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """The pids still alive after `timeout` (multiprocessing's resource tracker exits only once it
    notices its parent is gone, a moment after)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def socket_dirs(pid: int) -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"rapid_llm-{pid}-*"))


class ServerProcess:
    """`python -m rapid_llm.launch_server ...` on a free port, waited on until /health answers 200."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, startup_timeout: float = 120.0,
                 new_session: bool = False, netns: str | None = None, host: str = "127.0.0.1") -> None:
        """`new_session`: run it in its own process group (for signals sent to the whole group); `netns`: inside
        that network namespace (`ip netns exec`), listening on `host`."""
        self.port = free_port()
        self.base_url = f"http://{host}:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="rapid_llm-e2e-", suffix=".log")[1])
        self._log = self.log_path.open("w")
        self._final_log: str | None = None
        self.started = time.perf_counter()
        prefix = [] if netns is None else ["ip", "netns", "exec", netns]
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "rapid_llm.launch_server", "--port", str(self.port), "--host", host, *args],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
            start_new_session=new_session,
        )
        self.ready_after = self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.log()}")

    def metrics(self) -> dict[str, float]:
        """The rapid_llm:* samples of /metrics, by name (labels dropped)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=5).text
        values = {}
        for line in text.splitlines():
            match = re.match(r"^(rapid_llm:[a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
            if match:
                values[match.group(1)] = float(match.group(2))
        return values

    def greedy_token_ids(self, model: str, prompts: list[list[int]], new_tokens: int,
                         timeout: float = 120) -> list[list[int]]:
        """Exactly `new_tokens` greedy token ids per prompt (EOS masked until then) from one /v1/completions
        request, in prompt order."""
        body = {"model": model, "prompt": prompts, "max_tokens": new_tokens, "min_tokens": new_tokens,
                "temperature": 0.0, "return_token_ids": True}
        response = httpx.post(f"{self.base_url}/v1/completions", json=body, timeout=timeout).raise_for_status()
        return [choice["token_ids"] for choice in sorted(response.json()["choices"], key=lambda c: c["index"])]

    def beam_search(self, model: str, prompt: list[int], width: int = 2) -> httpx.Response:
        """A short beam-search completion request, answered as it is (refusals are 400s)."""
        return httpx.post(f"{self.base_url}/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": 4, "n": width, "use_beam_search": True,
            "temperature": 0.0}, timeout=60)

    def wait_until_idle(self, timeout: float = 5.0) -> dict[str, float]:
        """/metrics once no request runs and no KV block is referenced (an abort gets there a moment later)."""
        deadline = time.monotonic() + timeout
        while True:
            metrics = self.metrics()
            idle = metrics["rapid_llm:kv_cache_blocks_used"] == 0 and metrics["rapid_llm:num_requests_running"] == 0
            if idle or time.monotonic() > deadline:
                return metrics
            time.sleep(0.05)

    def log(self) -> str:
        if self._final_log is not None:
            return self._final_log
        self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._final_log is None:
            self._log.close()
            self._final_log = self.log_path.read_text()
            self.log_path.unlink()
        return self.process.returncode
