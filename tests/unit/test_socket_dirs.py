"""Per-launch socket directories: a new launch sweeps those of launchers that are no longer alive."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from rapid_llm.ipc.sockets import IpcPaths


def test_a_launch_removes_dead_launchers_socket_dirs_only() -> None:
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    dead = tempfile.mkdtemp(prefix=f"rapid_llm-{dead_pid}-deadbeef-")
    alive = tempfile.mkdtemp(prefix=f"rapid_llm-{os.getppid()}-cafef00d-")
    paths = IpcPaths.create(1)
    try:
        assert not os.path.exists(dead)
        assert os.path.isdir(alive) and os.path.isdir(paths.directory)
    finally:
        paths.remove()
        os.rmdir(alive)
