"""benchmarks/gpu/report.py on a made-up gpu_check.sh work folder: stage statuses, pytest lines, and the
ratios against the GPU's limits computed from the model's config and the measured ceilings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu.report import build, summary

LLAMA_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 64, "intermediate_size": 8192}


def _work(tmp_path: Path) -> Path:
    (tmp_path / "llama-1b").mkdir()
    (tmp_path / "llama-1b" / "config.json").write_text(json.dumps(LLAMA_1B))
    (tmp_path / "llama-1b" / "model.safetensors").write_bytes(bytes(4_300_000))
    (tmp_path / "stages.tsv").write_text("install\t0\t5\ntests-engine\t1\t80\nlatency-prefill\t124\t90\n"
                                         "serving-eager\t125\t0\n")
    (tmp_path / "tests-engine.log").write_text("....F\n===== 4 passed, 1 failed in 70.10s =====\n")
    (tmp_path / "ceilings.json").write_text(json.dumps({"copy_bandwidth_gb_s": 4300.0, "bf16_matmul_tflops": 800.0}))
    (tmp_path / "latency-decode.json").write_text(json.dumps(
        {"batch_size": 1, "decode_step_latency_ms": {"p50_ms": 0.0012, "avg_ms": 0.0013}}))
    (tmp_path / "hf-generate.json").write_text(json.dumps({"decode_step_ms": 0.006}))
    (tmp_path / "latency-prefill.json").write_text(json.dumps(
        {"batch_size": 8, "input_len": 2048, "prefill_latency_ms": {"p50_ms": 100.0}}))
    (tmp_path / "server-graphs.log").write_text(
        "INFO [worker0] KV cache: 1000 blocks of 16 tokens = 16000 tokens (+1 padding block), 0.49 GiB\n")
    return tmp_path


def test_statuses_ratios_and_memory(tmp_path: Path) -> None:
    results = build(_work(tmp_path))
    assert [(s["stage"], s["status"]) for s in results["stages"]] == [
        ("install", "ok"), ("tests-engine", "failed"), ("latency-prefill", "timed out"), ("serving-eager", "no time left")]
    assert results["stages"][1]["pytest"] == "4 passed, 1 failed in 70.10s"
    decode = results["decode"]
    assert decode["hbm_floor_ms"] == pytest.approx(0.001)  # 4.3 MB at 4300 GB/s
    assert decode["ratio_to_floor"] == pytest.approx(1.2) and decode["meets_goal"]
    assert decode["speedup_vs_transformers"] == pytest.approx(5.0)
    prefill = results["prefill"]
    assert prefill["tokens_per_s"] == pytest.approx(163_840)
    # 16 layers x (2048 x 3072 + 2048 x 2048 + 3 x 2048 x 8192) weights; attention 2 x 16 x 2048 x 2048 FLOPs.
    flops_per_token = 2 * 16 * (2048 * 3072 + 2048 * 2048 + 3 * 2048 * 8192) + 2 * 16 * 2048 * 2048
    assert prefill["achieved_tflops"] == pytest.approx(163_840 * flops_per_token / 1e12)
    assert prefill["share_of_peak"] == pytest.approx(prefill["achieved_tflops"] / 800)
    assert results["memory"]["kv_bytes_per_token"] == 2 * 16 * 512 * 2
    assert results["memory"]["requests_of_640_tokens_that_fit"] == 25
    assert results["serving"] == [] and results["step_gaps"] is None
    assert "tests-engine       failed" in summary(results)


def test_an_empty_work_folder_reports_nothing_measured(tmp_path: Path) -> None:
    results = build(tmp_path)
    assert results["stages"] == [] and results["decode"] is None and results["memory"] is None
    assert summary(results) == "\n"
