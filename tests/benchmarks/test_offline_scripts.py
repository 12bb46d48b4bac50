"""bench_offline_throughput.py (both backends), bench_latency.py and profile_step.py run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.profile_step import fill_kv_cache
from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.worker_proc.model_runner import ModelRunner

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], check=True, cwd=REPO,
                          capture_output=True, text=True, timeout=300).stdout


def test_offline_throughput_rapid_llm_and_hf(tiny_checkpoint, tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint()
    common = ["--model", str(checkpoint), "--dataset-name", "random", "--random-input-len", "16",
              "--random-output-len", "6", "--num-prompts", "5", "--temperature", "0", "--save-result",
              "--result-dir", str(tmp_path)]
    _run("bench_offline_throughput.py", *common, "--result-filename", "ours.json", "--num-kv-blocks", "64")
    _run("bench_offline_throughput.py", *common, "--result-filename", "hf.json", "--backend", "hf",
         "--hf-max-batch-size", "2")
    for name, backend in (("ours.json", "rapid_llm"), ("hf.json", "hf")):
        result = json.loads((tmp_path / name).read_text())
        assert result["backend"] == backend and result["num_requests"] == 5
        assert result["total_output_tokens"] == 30
        assert result["output_tokens_per_second"] > 0 and result["environment"]["versions"]["python"]


def test_latency(tiny_checkpoint, tmp_path: Path) -> None:
    _run("bench_latency.py", "--model", str(tiny_checkpoint()), "--batch-size", "2", "--input-len", "8",
         "--output-len", "4", "--num-iters-warmup", "1", "--num-iters", "2", "--num-kv-blocks", "64",
         "--save-result", "--result-dir", str(tmp_path), "--result-filename", "latency.json")
    result = json.loads((tmp_path / "latency.json").read_text())
    assert len(result["latencies"]) == 2 and result["avg_latency"] > 0
    assert set(result["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
    assert result["prefill_latency_ms"]["avg_ms"] > 0 and "p99_ms" in result["decode_step_latency_ms"]


def test_profile_step_times_a_mixed_step_with_pinned_ops(tiny_checkpoint) -> None:
    output = _run("profile_step.py", "--model", str(tiny_checkpoint()), "--decodes", "2", "--context-len", "20",
                  "--prefills", "1", "--prefill-len", "9", "--iters", "2", "--warmup", "1", "--profile",
                  "--op-backend", "linear=torch_ref")
    assert "step: 2 decodes at 20 + 1 prefills of 9" in output and "median" in output
    assert "linear=torch_ref" in output and "ATen ops" in output and "Self CPU" in output


def test_profile_step_fills_the_kv_cache_but_its_padding_block(tiny_checkpoint) -> None:
    runner = ModelRunner(ModelConfig.from_pretrained(str(tiny_checkpoint())), CacheConfig(block_size=16, num_blocks=4),
                         DeviceConfig("cpu"), {}, max_num_seqs=1)
    fill_kv_cache(runner)
    kept = [block for block in range(runner.kv_cache.num_blocks) if block != runner.padding_block]
    for tensor in range(runner.kv_cache.num_tensors):
        assert runner.kv_cache.read_blocks(tensor, kept).float().abs().sum() > 0
        assert not runner.kv_cache.read_blocks(tensor, [runner.padding_block]).any()
