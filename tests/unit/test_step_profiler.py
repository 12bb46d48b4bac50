"""The worker's step profiler (RAPID_LLM_TORCH_PROFILER_DIR / RAPID_LLM_PROFILE_STEPS) and benchmarks/gpu/step_gaps.py:
the window's parsing, a real CPU trace of a few steps read back, and exact numbers on a hand-made device trace."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.gpu import step_gaps
from rapid_llm.worker_proc.step_profiler import (ProfileWindow, StepProfiler, parse_profile_steps,
                                                 step_profiler_from_env)


def test_profile_steps_parse() -> None:
    assert parse_profile_steps("100:64") == ProfileWindow(skip=100, count=64)
    assert parse_profile_steps("0:1") == ProfileWindow(skip=0, count=1)


@pytest.mark.parametrize("text", ["", "64", ":64", "10:", "a:b", "-1:5", "5:0", "1:2:3", " 1:2", "1.5:2"])
def test_profile_steps_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="RAPID_LLM_PROFILE_STEPS"):
        parse_profile_steps(text)


def test_from_env(tmp_path: Path) -> None:
    assert step_profiler_from_env(0, environ={}) is None
    assert step_profiler_from_env(0, environ={"RAPID_LLM_TORCH_PROFILER_DIR": ""}) is None
    profiler = step_profiler_from_env(1, environ={"RAPID_LLM_TORCH_PROFILER_DIR": str(tmp_path / "new")})
    assert profiler is not None and profiler.window == ProfileWindow(100, 64)
    assert profiler.trace_path == tmp_path / "new" / "worker-rank1.json.gz" and profiler.trace_path.parent.is_dir()
    replica = step_profiler_from_env(0, 2, {"RAPID_LLM_TORCH_PROFILER_DIR": str(tmp_path),
                                            "RAPID_LLM_PROFILE_STEPS": "3:4"})
    assert replica is not None and replica.trace_path.name == "worker-dp2-rank0.json.gz"
    assert replica.window == ProfileWindow(3, 4)
    with pytest.raises(ValueError, match="RAPID_LLM_PROFILE_STEPS"):
        step_profiler_from_env(0, environ={"RAPID_LLM_TORCH_PROFILER_DIR": str(tmp_path),
                                           "RAPID_LLM_PROFILE_STEPS": "64"})
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="RAPID_LLM_TORCH_PROFILER_DIR"):
        step_profiler_from_env(0, environ={"RAPID_LLM_TORCH_PROFILER_DIR": str(tmp_path / "file" / "sub")})


def _run_steps(profiler: StepProfiler, steps: int) -> None:
    for _ in range(steps):
        with profiler.step():
            torch.randn(64, 64).matmul(torch.randn(64, 64)).sum()


def test_window_writes_a_trace_step_gaps_reads(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "worker-rank0.json.gz"
    profiler = StepProfiler(trace, ProfileWindow(skip=2, count=3))
    with caplog.at_level(logging.INFO, logger="rapid_llm.worker_proc.step_profiler"):
        _run_steps(profiler, 4)
        assert not trace.exists()
        _run_steps(profiler, 3)  # the window ends in the first of these; the rest are not recorded
    assert trace.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    assert [record.getMessage() for record in caplog.records] == [
        f"step profile of 3 worker steps (after 2) written to {trace}"]

    step_gaps.main([str(trace), "--json", str(tmp_path / "gaps.json")])
    report = json.loads((tmp_path / "gaps.json").read_text())
    assert report["steps"] == 3 and report["device_events"] == 0 and "CPU-only" in report["note"]
    assert report["cpu_step_count"] == 3 and 0 < report["cpu_step_p50_us"] <= report["cpu_step_max_us"]
    assert [set(row) for row in report["per_step"]] == [{"cpu_us"}] * 3
    assert "CPU-only" in capsys.readouterr().out


def _event(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def test_step_gaps_on_a_device_trace(tmp_path: Path) -> None:
    # Steps at [0, 100), [150, 250), [300, 350); kernels launched inside them and one memset launched between.
    events = [
        _event("user_annotation", "worker_step", 0, 100), _event("user_annotation", "worker_step", 150, 100),
        _event("user_annotation", "worker_step", 300, 50),
        _event("gpu_user_annotation", "worker_step", 50, 300),  # the device-side copy of the ranges: ignored
        *(_event("cuda_runtime", "cudaLaunchKernel", ts, 5, correlation=c) for ts, c in
          [(10, 1), (20, 2), (160, 3), (310, 4), (120, 5)]),
        _event("kernel", "k1", 50, 30, correlation=1), _event("gpu_memcpy", "copy", 80, 40, correlation=2),
        _event("kernel", "k3", 200, 50, correlation=3), _event("gpu_memset", "set", 255, 5, correlation=5),
        _event("kernel", "k4", 320, 30, correlation=4),
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 10, "cat": "ac2g", "name": "ac2g"},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [*events, {"name": "Record Window End", "ph": "i", "ts": 400}]}))
    report = step_gaps.analyse(step_gaps.load_events(path))
    # Busy: [50, 120) + [200, 250) + [255, 260) + [320, 350) = 155 of the window [0, 350).
    assert report["window_us"] == 350 and report["gpu_busy_us"] == 155
    assert report["gpu_idle_fraction"] == pytest.approx(195 / 350)
    assert (report["steps"], report["device_events"], report["device_events_outside_steps"]) == (3, 5, 1)
    assert (report["idle_gap_count"], report["idle_gap_sum_us"], report["idle_gap_p50_us"],
            report["idle_gap_p90_us"], report["idle_gap_max_us"]) == (3, 145, 60, 80, 80)
    assert report["per_step"] == [
        {"cpu_us": 100, "device_events": 2, "device_span_us": 70, "gap_before_us": None},
        {"cpu_us": 100, "device_events": 1, "device_span_us": 50, "gap_before_us": 80},
        {"cpu_us": 50, "device_events": 1, "device_span_us": 30, "gap_before_us": 70},  # from 250, not the memset
    ]
    assert (report["step_gap_count"], report["step_gap_sum_us"], report["step_gap_p50_us"],
            report["step_gap_p90_us"], report["step_gap_max_us"]) == (2, 150, 70, 80, 80)
    assert (report["cpu_step_sum_us"], report["cpu_step_p50_us"]) == (250, 100)
    assert report["top_device_work"][:2] == [{"name": "k3", "us_per_step": 50 / 3, "events_per_step": 1 / 3},
                                             {"name": "copy", "us_per_step": 40 / 3, "events_per_step": 1 / 3}]
    printed = step_gaps.summary(report)
    assert printed.startswith("3 steps over 350 us") and "idle 55.7%; 3 idle gaps, sum 145 us" in printed
