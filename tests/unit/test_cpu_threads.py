"""The worker's CPU threads per step: every core for long steps; for short ones one thread with small layers
and every core with big ones; OMP_NUM_THREADS fixes the count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rapid_llm.worker_proc.cpu_threads import (MIN_PARALLEL_STEP_CONTEXT, MIN_PARALLEL_STEP_TOKENS,
                                               MIN_PARALLEL_WEIGHT_BYTES, CpuThreadPolicy, cpu_thread_policy)


def _model(out_features: int, in_features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, out_features, bias=True, dtype=torch.bfloat16), nn.LayerNorm(8))


@pytest.fixture(autouse=True)
def _no_omp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_small_layers_get_one_thread_for_short_steps_and_every_core_for_long_ones() -> None:
    policy, reason = cpu_thread_policy(_model(2048, 256), available=2)  # 1 MiB, llama-10m's gate_up
    assert policy == CpuThreadPolicy(1, 2) and "1.0 MiB" in reason
    assert policy.threads_for(MIN_PARALLEL_STEP_TOKENS - 1, MIN_PARALLEL_STEP_CONTEXT - 1) == 1
    assert policy.threads_for(MIN_PARALLEL_STEP_TOKENS) == 2  # a prompt chunk
    assert policy.threads_for(1, MIN_PARALLEL_STEP_CONTEXT) == 2  # a decode over a long context


def test_big_layers_get_every_core() -> None:
    elements = MIN_PARALLEL_WEIGHT_BYTES // 2  # bf16
    assert cpu_thread_policy(_model(elements // 1024, 1024), available=4)[0] == CpuThreadPolicy(4, 4)
    assert cpu_thread_policy(_model(elements // 1024 - 32, 1024), available=4)[0] == CpuThreadPolicy(1, 4)


def test_omp_num_threads_fixes_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_thread_policy(_model(64, 64), available=2) == (CpuThreadPolicy(2, 2), "OMP_NUM_THREADS is set")


def test_one_core_stays_one() -> None:
    assert cpu_thread_policy(_model(64, 64), available=1)[0] == CpuThreadPolicy(1, 1)


def test_apply_sets_torch_threads_by_step_length() -> None:
    previous = torch.get_num_threads()
    try:
        policy = CpuThreadPolicy(1, 2)
        policy.apply(1)
        assert torch.get_num_threads() == 1
        policy.apply(MIN_PARALLEL_STEP_TOKENS)
        assert torch.get_num_threads() == 2
        policy.apply(4, 100)
        assert torch.get_num_threads() == 1
        policy.apply(1, MIN_PARALLEL_STEP_CONTEXT)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
