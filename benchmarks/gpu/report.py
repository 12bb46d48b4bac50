"""Turns a gpu_check.sh work folder into results.json and summary.txt: every stage's exit, and the numbers
against the GPU's limits.

    python benchmarks/gpu/report.py --work /tmp/rapid_llm-gpu-work --out $OUT

Key design choice: it reads whatever the stages left and never fails on a missing file, so gpu_check.sh
calls it after every stage and a call cut short still brings back what it measured. Floors: a decode step
reads every weight once (tied embeddings counted once), so its floor is weight bytes / measured copy
bandwidth; prefill's rate is 2 x non-embedding parameters + causal attention FLOPs per token, against the
measured bf16 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

DECODE_FLOOR_GOAL = 1.3
PREFILL_PEAK_GOAL = 0.5
KV_LINE = re.compile(r"KV cache: (\d+) blocks of (\d+) tokens = (\d+) tokens .*?, ([\d.]+) GiB")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stages(work: Path) -> list[dict[str, Any]]:
    rows = []
    if (work / "stages.tsv").exists():
        for line in (work / "stages.tsv").read_text().splitlines():
            name, code, seconds = line.split("\t")
            rows.append({"stage": name, "exit": int(code), "seconds": int(seconds),
                         "status": {"0": "ok", "124": "timed out", "125": "no time left"}.get(code, "failed")})
    return rows


def _pytest_line(work: Path, stage: str) -> str | None:
    """The last pytest outcome line of a stage's log ('3 passed, 1 failed in 9.1s')."""
    try:
        lines = (work / f"{stage}.log").read_text().splitlines()
    except OSError:
        return None
    return next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), None)


def _model_figures(model_dir: Path) -> dict[str, Any] | None:
    config = _json(model_dir / "config.json")
    if config is None:
        return None
    weight_bytes = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_dim, kv_dim = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    per_layer = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * config["intermediate_size"]
    return {"weight_bytes": weight_bytes, "non_embedding_params": layers * per_layer, "layers": layers,
            "q_dim": q_dim, "kv_bytes_per_token": 2 * layers * kv_dim * 2}


def _decode(work: Path, ceilings: dict | None, model: dict | None) -> dict[str, Any] | None:
    latency = _json(work / "latency-decode.json")
    if latency is None:
        return None
    step_ms = latency["decode_step_latency_ms"]["p50_ms"]
    result: dict[str, Any] = {"batch_size": latency["batch_size"], "step_ms_p50": step_ms,
                              "step_ms_avg": latency["decode_step_latency_ms"]["avg_ms"]}
    if ceilings and model:
        floor_ms = 1e3 * model["weight_bytes"] / (ceilings["copy_bandwidth_gb_s"] * 1e9)
        result.update(hbm_floor_ms=floor_ms, ratio_to_floor=step_ms / floor_ms,
                      meets_goal=step_ms / floor_ms <= DECODE_FLOOR_GOAL)
    hf = _json(work / "hf-generate.json")
    if hf:
        result.update(transformers_step_ms=hf["decode_step_ms"], speedup_vs_transformers=hf["decode_step_ms"] / step_ms)
    return result


def _prefill(work: Path, ceilings: dict | None, model: dict | None) -> dict[str, Any] | None:
    latency = _json(work / "latency-prefill.json")
    if latency is None:
        return None
    seconds = latency["prefill_latency_ms"]["p50_ms"] / 1e3
    tokens = latency["batch_size"] * latency["input_len"]
    result: dict[str, Any] = {"batch_size": latency["batch_size"], "input_len": latency["input_len"],
                              "latency_ms_p50": 1e3 * seconds, "tokens_per_s": tokens / seconds}
    if ceilings and model:
        # Causal attention: QK^T and PV over on average input_len / 2 keys, 2 FLOPs a multiply-add.
        attention = 2 * 2 * model["layers"] * model["q_dim"] * latency["input_len"] / 2
        tflops = tokens / seconds * (2 * model["non_embedding_params"] + attention) / 1e12
        result.update(achieved_tflops=tflops, share_of_peak=tflops / ceilings["bf16_matmul_tflops"],
                      meets_goal=tflops / ceilings["bf16_matmul_tflops"] >= PREFILL_PEAK_GOAL)
    return result


def _serving(work: Path) -> list[dict[str, Any]]:
    rows = []
    for mode in ("graphs", "eager"):
        for concurrency in (1, 32, 128):
            run = _json(work / f"serving-{mode}-c{concurrency}.json")
            if run is None:
                continue
            gpu = (run.get("resources") or {}).get("gpu", {})
            rows.append({"mode": mode, "concurrency": concurrency, "completed": run["completed"],
                         "failed": run["failed"], "output_throughput": run["output_throughput"],
                         "median_ttft_ms": run["median_ttft_ms"], "median_tpot_ms": run["median_tpot_ms"],
                         "p99_tpot_ms": run["p99_tpot_ms"], "server_gpu_memory_mib_peak": gpu.get("server_memory_mib_peak")})
    return rows


def _memory(work: Path, model: dict | None) -> dict[str, Any] | None:
    try:
        match = KV_LINE.search((work / "server-graphs.log").read_text())
    except OSError:
        match = None
    if match is None or model is None:
        return None
    blocks, block_size, tokens, gib = match.groups()
    request_tokens = 512 + 128
    return {"kv_pool_gib": float(gib), "kv_pool_tokens": int(tokens),
            "kv_bytes_per_token": model["kv_bytes_per_token"],
            "kv_mib_per_request_640_tokens": model["kv_bytes_per_token"] * request_tokens / 2**20,
            "requests_of_640_tokens_that_fit": int(tokens) // request_tokens}


def build(work: Path) -> dict[str, Any]:
    ceilings = _json(work / "ceilings.json")
    model = _model_figures(work / "llama-1b")
    stages = _stages(work)
    for row in stages:
        if row["stage"].startswith("tests-"):
            row["pytest"] = _pytest_line(work, row["stage"])
    return {"stages": stages, "ceilings": ceilings, "model": model, "decode": _decode(work, ceilings, model),
            "prefill": _prefill(work, ceilings, model), "serving": _serving(work),
            "memory": _memory(work, model), "step_gaps": _json(work / "step-gaps.json")}


def summary(results: dict[str, Any]) -> str:
    lines = [f"{s['stage']:<18} {s['status']:<12} {s['seconds']:>4} s  {s.get('pytest') or ''}" for s in results["stages"]]
    for key in ("ceilings", "decode", "prefill", "memory"):
        if results[key]:
            lines.append(f"{key}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in results[key].items()))
    for row in results["serving"]:
        lines.append(f"serving {row['mode']} c={row['concurrency']}: {row['output_throughput']:.0f} tok/s, "
                     f"TTFT p50 {row['median_ttft_ms']:.1f} ms, TPOT p50 {row['median_tpot_ms']:.2f} ms, "
                     f"failed {row['failed']}")
    gaps = results["step_gaps"]
    if gaps:
        lines.append("step gaps: " + json.dumps({k: v for k, v in gaps.items() if not isinstance(v, (list, dict))}))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = build(args.work)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "summary.txt").write_text(summary(results))


if __name__ == "__main__":
    main()
