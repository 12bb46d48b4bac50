"""The engine children of a server under test, by process title, and the check that a dead one took all down.

Usage: `children = engine_children(server)`; kill one; `assert_all_gone(server, children, "dp1-worker0")`.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.server import ServerProcess, child_pids, socket_dirs, wait_gone


def engine_children(server: ServerProcess) -> dict[int, str]:
    """pid -> role ("scheduler", "dp1-worker0", ...) of the server's rapid_llm children."""
    titles = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
              for pid in child_pids(server.process.pid)}
    return {pid: title.removeprefix("rapid_llm::") for pid, title in titles.items() if title.startswith("rapid_llm::")}


def assert_all_gone(server: ServerProcess, children: dict[int, str], died: str) -> None:
    """The server exited 1 saying that `died` died, and left no child and no socket directory."""
    assert server.process.wait(timeout=30) == 1
    server.stop()
    assert f"the {died} process died" in server.log()
    assert wait_gone(list(children)) == []
    assert socket_dirs(server.process.pid) == []
