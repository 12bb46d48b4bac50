"""A `launch_server` child for a benchmark: started with the given flags, healthy once constructed, stopped by
`close()` (or as a context manager). Key design choice: the server's log goes to a file beside the results, so a
failed start says where to look. Usage: `with ServerProcess(["--model", m, "--port", "30000"], 30000, log): ...`
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


class ServerProcess:
    def __init__(self, flags: list[str], port: int, log: Path, startup_timeout: float = 300.0) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, "-m", "rapid_llm.launch_server", "--port", str(port), *flags],
                                        stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + startup_timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"the server ({' '.join(flags)}) did not become healthy; see {log}")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
