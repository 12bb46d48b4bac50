"""Whether Triton's interpreter runs here (TRITON_INTERPRET=1, set by tests/conftest.py without CUDA) and, if
it runs, whether it can run our kernels: a probe kernel, run once at import."""

from __future__ import annotations

import os

import numpy as np
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _interpreter_fault() -> str | None:
    """Why this Triton's interpreter cannot run our kernels, or None: Triton 3.6's turns a loaded scalar (a
    one-element array there) into a loop bound with int(), which NumPy 2.5 refuses; 3.9 squeezes it first."""
    try:
        import triton
        import triton.language as tl
        from triton.runtime.errors import InterpreterError
    except ImportError:  # Linux-only: the kernel tests skip themselves without it
        return None

    @triton.jit
    def _loop_to_loaded_bound(bound_ptr):
        for _ in range(tl.load(bound_ptr)):
            pass

    try:
        _loop_to_loaded_bound[(1,)](torch.ones(1, dtype=torch.int32))
    except InterpreterError as error:
        return (f"Triton {triton.__version__}'s interpreter cannot take a loaded scalar as a loop bound with NumPy "
                f"{np.__version__} ({error}); these kernels run compiled on CUDA (-m gpu)")
    return None


INTERPRETER_FAULT = _interpreter_fault() if INTERPRETED else None
