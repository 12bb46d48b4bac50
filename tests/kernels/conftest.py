"""Kernel-test setup: Triton's interpreter on machines without CUDA, and the device each test runs on.

TRITON_INTERPRET must be set before triton (or a module defining a Triton kernel) is imported, so the
root tests/conftest.py sets it, and only where no CUDA device exists: on a GPU machine the same
tests run compiled on CUDA (`-m gpu`), and their CPU variants skip.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_interpreter import INTERPRETED, INTERPRETER_FAULT


@pytest.fixture(params=[
    pytest.param("cpu", marks=[
        pytest.mark.skipif(not INTERPRETED, reason="Triton runs CPU tensors only under its interpreter "
                           "(TRITON_INTERPRET=1), which tests/conftest.py sets only without CUDA"),
        pytest.mark.skipif(INTERPRETER_FAULT is not None, reason=str(INTERPRETER_FAULT))]),
    pytest.param("cuda", marks=pytest.mark.gpu),
])
def triton_device(request: pytest.FixtureRequest) -> torch.device:
    """The device a Triton kernel test runs on: CPU under the interpreter, or CUDA compiled."""
    return torch.device(request.param)
