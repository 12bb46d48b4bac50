"""bench_serving's `resources` and `error_summary` blocks, filled from a live rapid_llm server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from benchmarks.common.errors import error_reason
from tests.e2e.server import ServerProcess, free_port

pytest.importorskip("aiohttp", reason="the benchmark client needs aiohttp")

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_PROMPTS = 6
ENGINE_PROCESSES = ("rapid_llm::frontend", "rapid_llm::scheduler", "rapid_llm::detokenizer", "rapid_llm::worker0")


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint("LlamaForCausalLM")


@pytest.fixture(scope="module")
def server(checkpoint) -> Iterator[ServerProcess]:
    process = ServerProcess("--model", str(checkpoint), "--num-kv-blocks", "256", "--log-level", "warning")
    yield process
    process.stop()


def bench(tmp_path: Path, base_url: str, *extra: str) -> tuple[dict[str, Any], str]:
    """Run bench_serving; (the saved result, what it printed)."""
    command = [
        sys.executable, "benchmarks/bench_serving.py", "--base-url", base_url, "--dataset-name", "random",
        "--random-input-len", "32", "--random-output-len", "64", "--num-prompts", str(NUM_PROMPTS),
        "--temperature", "0", "--disable-tqdm", "--resource-interval", "0.1",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "result.json", *extra,
    ]
    run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads((tmp_path / "result.json").read_text()), run.stdout


def test_a_good_run_samples_every_engine_process(server: ServerProcess, tmp_path: Path) -> None:
    result, printed = bench(tmp_path, server.base_url)
    assert result["completed"] == NUM_PROMPTS
    resources = result["resources"]
    assert resources["source"] == "/proc" and resources["server_pids"] == [server.process.pid]
    assert resources["samples"] >= 2
    by_title = {process["title"]: process for process in resources["processes"]}
    for title in ENGINE_PROCESSES:
        process = by_title[title]
        # The worker holds torch and the model: tens of MiB at least; every process is a Python interpreter.
        assert 5 < process["rss_mib_peak"] < 16_000, process
        assert 0 < process["rss_mib_mean"] <= process["rss_mib_peak"]
        assert process["samples"] == resources["samples"]
        assert 0 <= process["cpu_percent_mean"] <= 100 * 64
        assert process["cpu_percent_peak"] >= process["cpu_percent_mean"] * 0.99
    # The run decodes 6 x 64 tokens: the worker was busy.
    assert by_title["rapid_llm::worker0"]["cpu_percent_mean"] > 1
    assert by_title["rapid_llm::worker0"]["rss_mib_peak"] > by_title["rapid_llm::detokenizer"]["rss_mib_peak"]
    assert resources["total"]["rss_mib_peak"] >= sum(by_title[t]["rss_mib_peak"] for t in ENGINE_PROCESSES) * 0.9
    gpu = resources["gpu"]
    assert gpu.get("unavailable") or gpu["devices"], gpu
    assert result["error_summary"] == {"total": 0, "rate": 0.0, "reasons": []}
    assert "rapid_llm::worker0 peak RSS (MiB):" in printed and "Error rate:" in printed


def test_refused_requests_are_counted_by_reason(server: ServerProcess, tmp_path: Path) -> None:
    result, printed = bench(tmp_path, server.base_url, "--extra-body", '{"max_tokens": -1}')
    assert result["failed"] == NUM_PROMPTS
    summary = result["error_summary"]
    assert summary["total"] == NUM_PROMPTS and summary["rate"] == 1.0
    [reason] = summary["reasons"]
    assert reason["count"] == NUM_PROMPTS
    assert reason["reason"].startswith("HTTP 400: ") and "max_tokens" in reason["reason"], reason
    assert f"{NUM_PROMPTS} x HTTP 400" in printed


def test_an_unreachable_server_is_a_connection_reason_and_no_resources(checkpoint, tmp_path: Path) -> None:
    port = free_port()
    result, _ = bench(tmp_path, f"http://127.0.0.1:{port}", "--model", str(checkpoint))
    summary = result["error_summary"]
    assert summary["total"] == NUM_PROMPTS and summary["rate"] == 1.0
    [reason] = summary["reasons"]
    assert "ClientConnectorError" in reason["reason"] and str(port) in reason["reason"], reason
    assert result["resources"] == {
        "unavailable": f"no process on this machine listens on port {port} (a remote server? pass --server-pid)"}


@pytest.mark.parametrize(("error", "reason"), [
    ('HTTP 400 Bad Request: {"error": {"message": "max_tokens must be at least 1", "param": "max_tokens"}}',
     "HTTP 400: max_tokens must be at least 1"),
    ("HTTP 503 Service Unavailable: overloaded", "HTTP 503: overloaded"),
    ('error event: {"error": {"message": "worker failed"}}', "error event: worker failed"),
    ("Traceback (most recent call last):\n  File x\nConnectionResetError: reset by peer\n",
     "ConnectionResetError: reset by peer"),
])
def test_error_reasons_drop_what_is_particular_to_the_request(error: str, reason: str) -> None:
    assert error_reason(error) == reason
