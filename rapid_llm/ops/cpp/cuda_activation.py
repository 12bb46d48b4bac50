"""The `cuda_cpp` silu_and_mul: the example of a CUDA C++ op going write -> JIT compile -> register -> dispatch.

`csrc/silu_and_mul.cu` is compiled with nvcc by `torch.utils.cpp_extension.load` the first time dispatch
selects this implementation on a CUDA device (cached like every JIT extension, `jit.py`). The catalog's
conditions check the device first, so on a machine without a CUDA device nothing is compiled, whatever
nvcc is installed; `skip_reason` then names what is missing.
Usage: `ops.silu_and_mul(x)` on CUDA, or `--op-backend silu_and_mul=cuda_cpp`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.cpp.jit import JitExtension

CUDA_OPS = JitExtension("rapid_llm_cuda_ops", ("silu_and_mul.cu",), cflags=("-O3",), cuda_cflags=("-O3",))


def skip_reason(device_type: str, dtype: str) -> str | None:
    return CUDA_OPS.skip_reason()


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, where x is [..., 2 * intermediate] = [gate | up] (same contract as torch_ref)."""
    x = x.contiguous()
    out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
    CUDA_OPS.load().silu_and_mul(out, x)
    return out
