"""The worker's CPU thread count: one thread for small layers, every core for big ones, OMP_NUM_THREADS kept."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rapid_llm.worker_proc.cpu_threads import MIN_PARALLEL_WEIGHT_BYTES, choose_cpu_threads


def _model(out_features: int, in_features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(in_features, out_features, bias=True, dtype=torch.bfloat16), nn.LayerNorm(8))


@pytest.fixture(autouse=True)
def _no_omp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


def test_small_layers_get_one_thread() -> None:
    threads, reason = choose_cpu_threads(_model(2048, 256), available=2)  # 1 MiB, llama-10m's gate_up
    assert threads == 1 and "1.0 MiB" in reason


def test_big_layers_get_every_core() -> None:
    elements = MIN_PARALLEL_WEIGHT_BYTES // 2  # bf16
    assert choose_cpu_threads(_model(elements // 1024, 1024), available=4)[0] == 4
    assert choose_cpu_threads(_model(elements // 1024 - 32, 1024), available=4)[0] == 1


def test_omp_num_threads_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_cpu_threads(_model(64, 64), available=2) == (2, "OMP_NUM_THREADS is set")


def test_one_core_stays_one() -> None:
    assert choose_cpu_threads(_model(64, 64), available=1)[0] == 1
