"""Kernel-test setup: Triton's interpreter on machines without CUDA, and the device each test runs on.

TRITON_INTERPRET must be set before triton (or a module defining a Triton kernel) is imported, so
it is set here, at collection, and only where no CUDA device exists: on a GPU machine the same
tests run compiled on CUDA (`-m gpu`), and their CPU variants skip.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(params=[
    pytest.param("cpu", marks=pytest.mark.skipif(
        not INTERPRETED, reason="Triton runs CPU tensors only under its interpreter (TRITON_INTERPRET=1), which "
        "this conftest sets only without CUDA")),
    pytest.param("cuda", marks=pytest.mark.gpu),
])
def triton_device(request: pytest.FixtureRequest) -> torch.device:
    """The device a Triton kernel test runs on: CPU under the interpreter, or CUDA compiled."""
    return torch.device(request.param)
