"""bf16/fp16 models on CPUs whose oneDNN has no native bf16/fp16 kernels (e.g. AVX2): compute in fp32.

There a bf16 GEMM costs about one GEMV per row, so from a few rows on fp32 is several times faster
even counting the weight's conversion on the fly ([32, 2560] x [2560, 768]: 16.6 ms in bf16, 3.8 ms
converting to fp32, one thread), while a one-row decode GEMV is as fast or faster in bf16 (it reads
half the bytes). So the `cpu_fp32` linear kernel computes calls with at least `MIN_FP32_ROWS` rows in
fp32 (inputs and weight cast up, the result back) and the rest in the model dtype; weights stay
stored in the model dtype. Attention casts its inputs to `compute_dtype` (a decode over 192 keys:
1.03 vs 0.37 ms). Roundings match the half kernels' (half inputs, fp32 accumulation, one rounding).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from rapid_llm.config.dtypes import dtype_name
from rapid_llm.ops.linear_kernel import LinearKernel

MIN_FP32_ROWS = 4


@lru_cache(maxsize=None)
def cpu_lacks_half_kernels(dtype: torch.dtype) -> bool:
    name = dtype_name(dtype)
    if not torch.backends.mkldnn.is_available():  # a torch build without oneDNN has no half kernels either
        return name in ("bfloat16", "float16")
    if name == "bfloat16":
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if name == "float16":
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def half_kernels_missing(device_type: str, dtype: str) -> str | None:
    """The `available` condition of `cpu_fp32`: it applies only where oneDNN lacks native half kernels."""
    if cpu_lacks_half_kernels(getattr(torch, dtype)):
        return None
    return f"this CPU's oneDNN has native {dtype} kernels, so computing in fp32 does not pay off"


def compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute in for tensors of `dtype` on `device`."""
    return torch.float32 if device.type == "cpu" and cpu_lacks_half_kernels(dtype) else dtype


class CpuFp32Linear(LinearKernel):
    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[0] < MIN_FP32_ROWS:
            return F.linear(x, weight, bias)
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


CPU_FP32_LINEAR = CpuFp32Linear()
