"""Shared fixtures: tiny random checkpoints built once per session (never downloaded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest
import torch

# Triton reads TRITON_INTERPRET when it is imported (Triton 3.6 also decorates its own tl.* helpers then), and
# with a CUDA build of torch, transformers' model classes import it through torch._dynamo: so it is set here,
# before any of that, and only where no CUDA device exists (tests/kernels/conftest.py says why).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint  # noqa: E402 (after TRITON_INTERPRET)

CheckpointFactory = Callable[..., Path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> CheckpointFactory:
    """`tiny_checkpoint(architecture, dtype=..., **config_overrides)` -> checkpoint dir, cached per arguments."""
    cache: dict[str, Path] = {}

    def build(architecture: str = "LlamaForCausalLM", dtype: torch.dtype = torch.float32, **overrides: object) -> Path:
        key = repr((architecture, dtype, sorted(overrides.items())))
        if key not in cache:
            cache[key] = build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), architecture, dtype, **overrides)
        return cache[key]

    return build
