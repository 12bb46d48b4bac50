"""Server life cycle: idle CPU, clean and quick shutdown, process names, start-up failures, the packaged demo model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.conftest import LONG_REQUEST, long_kv_blocks
from tests.e2e.server import ServerProcess, child_pids, cpu_seconds, socket_dirs, wait_gone

IDLE_WINDOW_S = 10.0


def test_idle_server_sleeps_and_sigterm_leaves_nothing_behind(checkpoint) -> None:
    server = ServerProcess("--model", str(checkpoint), "--num-kv-blocks", "64", "--log-level", "warning")
    children = child_pids(server.process.pid)
    assert len(children) >= 3, "expected scheduler, detokenizer and worker children"
    assert len(socket_dirs(server.process.pid)) == 1
    httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "warm up", "max_tokens": 4}, timeout=30)
    time.sleep(1.0)
    pids = [server.process.pid, *children]
    before = sum(cpu_seconds(pid) for pid in pids)
    time.sleep(IDLE_WINDOW_S)
    used = sum(cpu_seconds(pid) for pid in pids) - before
    assert used / IDLE_WINDOW_S < 0.02, f"idle server used {100 * used / IDLE_WINDOW_S:.1f}% of a core"

    assert server.stop(signal.SIGTERM) == 0
    assert wait_gone(children) == []
    assert socket_dirs(server.process.pid) == []


def process_title(pid: int) -> str:
    """What `ps` shows for the process (setproctitle rewrites its command line)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()


def test_processes_are_named_for_ps(checkpoint) -> None:
    server = ServerProcess("--model", str(checkpoint), "--num-kv-blocks", "64", "--log-level", "warning")
    try:
        titles = {process_title(pid) for pid in [server.process.pid, *child_pids(server.process.pid)]}
    finally:
        server.stop()
    assert {"rapid_llm::frontend", "rapid_llm::scheduler", "rapid_llm::detokenizer", "rapid_llm::worker0"} <= titles


def test_ctrl_c_with_a_stream_in_flight_is_quick_and_quiet(long_checkpoint) -> None:
    # A grace period far longer than the bound below: Ctrl-C must not wait for it.
    server = ServerProcess("--model", str(long_checkpoint), "--num-kv-blocks", long_kv_blocks(1), "--log-level",
                           "warning", "--shutdown-timeout", "30")
    children = child_pids(server.process.pid)
    body = {**LONG_REQUEST, "stream": True}  # still streaming after a second
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{server.base_url}/v1/completions", json=body, timeout=60)
        time.sleep(1.0)
        started = time.monotonic()
        assert server.stop(signal.SIGINT) == 0
        stopped_after = time.monotonic() - started
        assert "the server is shutting down" in pending.result().text
    # About 1 s when idle; the bound leaves room for a busy CI machine.
    assert stopped_after < 8, f"Ctrl-C took {stopped_after:.1f} s; server log:\n{server.log()}"
    assert wait_gone(children) == []
    assert socket_dirs(server.process.pid) == []
    assert "Traceback" not in server.log() and "CancelledError" not in server.log()


def test_sigterm_to_the_process_group_is_a_normal_stop(checkpoint) -> None:
    server = ServerProcess("--model", str(checkpoint), "--num-kv-blocks", "64", new_session=True)
    children = child_pids(server.process.pid)
    os.killpg(server.process.pid, signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    server.stop()
    assert wait_gone(children) == []
    assert "died" not in server.log() and "ERROR" not in server.log()


def test_bad_model_path_exits_fast_with_one_line_cause(tmp_path) -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "rapid_llm.launch_server", "--model", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - started < 15
    assert result.stderr.splitlines()[-1].endswith("does not exist; pass a local Hugging Face checkpoint directory")
    assert "Traceback" not in result.stderr


def test_child_startup_failure_is_reported(checkpoint, tmp_path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in checkpoint.iterdir():
        if item.name != "model.safetensors":
            (broken / item.name).write_bytes(item.read_bytes())
    result = subprocess.run([sys.executable, "-m", "rapid_llm.launch_server", "--model", str(broken),
                             "--num-kv-blocks", "8"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "worker0 failed to start" in result.stderr and "safetensors" in result.stderr


def test_no_model_serves_the_packaged_demo_target() -> None:
    server = ServerProcess("--num-kv-blocks", "128")
    try:
        assert "no model given: serving the packaged demo model 'demo-target' (LlamaForCausalLM, 15.7M " \
               "parameters, trained on CPython's standard library) from " in server.log()
        # The op choices are one info line (each op with its reason is at debug level).
        assert server.log().count("op backends: ") == 1 and "attention=" in server.log()
        response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "import ", "max_tokens": 5},
                              timeout=30).json()
        models = httpx.get(f"{server.base_url}/v1/models", timeout=5).json()
    finally:
        server.stop()
    assert response["usage"]["completion_tokens"] >= 1
    assert response["model"] == "demo-target" and [model["id"] for model in models["data"]] == ["demo-target"]


def test_a_child_dying_later_brings_the_server_down(long_checkpoint) -> None:
    """Requests in flight when the worker dies get a 503 at once, and the server exits 1."""
    server = ServerProcess("--model", str(long_checkpoint), "--num-kv-blocks", long_kv_blocks(1), "--log-level",
                           "warning")
    titles = {pid: process_title(pid) for pid in child_pids(server.process.pid)}
    engine_children = [pid for pid, title in titles.items() if title.startswith("rapid_llm::")]
    worker = next(pid for pid, title in titles.items() if title == "rapid_llm::worker0")
    body = LONG_REQUEST
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{server.base_url}/v1/completions", json=body, timeout=60)
        time.sleep(0.5)
        os.kill(worker, signal.SIGKILL)
        started = time.monotonic()
        response = pending.result()
    assert response.status_code == 503 and "process died" in response.json()["error"]["message"]
    assert time.monotonic() - started < 10
    try:
        assert server.process.wait(timeout=30) == 1
    finally:
        server.stop()
    assert "died (exit code -9); shutting the server down" in server.log()
    assert wait_gone(engine_children) == []
    assert socket_dirs(server.process.pid) == []
