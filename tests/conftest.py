"""Shared fixtures: tiny random checkpoints built once per session (never downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint

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
