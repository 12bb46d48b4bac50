"""bench_serving.py end to end against a real rapid_llm server on a tiny random checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.server import ServerProcess

pytest.importorskip("aiohttp", reason="the benchmark client needs aiohttp")

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_PROMPTS = 8
OUTPUT_LEN = 8


@pytest.fixture(scope="module")
def server(tiny_checkpoint) -> Iterator[ServerProcess]:
    process = ServerProcess("--model", str(tiny_checkpoint("LlamaForCausalLM")), "--num-kv-blocks", "256",
                            "--log-level", "warning")
    yield process
    process.stop()


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_bench_serving_against_rapid_llm(server: ServerProcess, backend: str, tmp_path: Path) -> None:
    command = [
        sys.executable, "benchmarks/bench_serving.py", "--backend", backend, "--base-url", server.base_url,
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(NUM_PROMPTS), "--ignore-eos", "--temperature", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(tmp_path), "--result-filename", "result.json",
    ]
    run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "============ Serving Benchmark Result ============" in run.stdout

    result = json.loads((tmp_path / "result.json").read_text())
    assert result["backend"] == result["endpoint_type"] == backend
    assert result["model_id"] == result["tokenizer_id"]  # the checkpoint path from /v1/models' root
    assert result["num_prompts"] == result["completed"] == NUM_PROMPTS
    assert result["failed"] == 0
    assert result["total_output_tokens"] == OUTPUT_LEN * NUM_PROMPTS
    assert result["total_input_tokens"] >= 32 * NUM_PROMPTS
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
                "mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "p50_e2el_ms"):
        assert result[key] > 0, key
    assert 1 <= result["max_concurrent_requests"] <= NUM_PROMPTS
    assert result["request_rate"] == "inf" and result["request_goodput"] is None
    assert len(result["latencies"]) == NUM_PROMPTS and "ttfts" not in result
    env = result["environment"]
    assert env["versions"]["rapid_llm"] and env["cpu"]["count"] >= 1
    assert "server_info" in env
    spec = result["spec_decode"]  # speculation is off: the counters exist, no draft was verified
    assert spec["num_drafts"] == 0 and spec["acceptance_rate"] is None and spec["mean_acceptance_length"] is None


def test_bench_serving_reports_acceptance_over_the_timed_run(tiny_checkpoint, tmp_path: Path) -> None:
    from benchmarks.common.spec_decode import fetch_spec_counters

    process = ServerProcess("--model", str(tiny_checkpoint("LlamaForCausalLM")), "--num-kv-blocks", "256",
                            "--log-level", "warning", "--speculative-config",
                            '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_threshold": 0}')
    try:
        before = fetch_spec_counters(process.base_url)
        command = [
            sys.executable, "benchmarks/bench_serving.py", "--base-url", process.base_url, "--dataset-name", "random",
            "--random-input-len", "32", "--random-output-len", "24", "--num-prompts", str(NUM_PROMPTS),
            "--num-warmups", "2", "--temperature", "0", "--disable-tqdm",
            "--save-result", "--result-dir", str(tmp_path), "--result-filename", "result.json",
        ]
        run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        after = fetch_spec_counters(process.base_url)
    finally:
        process.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Speculative Decoding" in run.stdout and "Acceptance rate (%):" in run.stdout
    spec = json.loads((tmp_path / "result.json").read_text())["spec_decode"]
    # A tiny random model's greedy output repeats itself: the n-gram lookup drafts.
    assert spec is not None and spec["num_drafts"] > 0
    # The warm-ups verified drafts too, outside the timed run.
    assert spec["num_drafts"] < after["num_drafts"] - before["num_drafts"]
    assert spec["num_draft_tokens"] <= 3 * spec["num_drafts"]
    assert spec["acceptance_rate"] == spec["num_accepted_tokens"] / spec["num_draft_tokens"]
    assert spec["mean_acceptance_length"] == 1 + spec["num_accepted_tokens"] / spec["num_drafts"]
    rates = spec["per_position_acceptance_rate"]
    assert len(rates) <= 3 and rates == sorted(rates, reverse=True)
    assert round(sum(rates) * spec["num_drafts"]) == spec["num_accepted_tokens"]
