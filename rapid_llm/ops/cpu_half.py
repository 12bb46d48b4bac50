"""bf16/fp16 models on CPUs whose oneDNN has no native bf16/fp16 kernels (e.g. AVX2): compute in fp32.

There a bf16 GEMM costs about one GEMV per row, so from a few rows on fp32 is several times faster
even counting the weight's conversion on the fly ([32, 2560] x [2560, 768]: 16.6 ms in bf16, 3.8 ms
converting to fp32, one thread), while a one-row decode GEMV is as fast or faster in bf16 (it reads
half the bytes). So the `cpu_fp32` linear takes calls with at least `MIN_FP32_ROWS` rows (prefill
chunks, batched decodes) and casts inputs and weight up and the result back; weights stay stored in
the model dtype. Attention casts its inputs to `compute_dtype` (a decode over 192 keys: 1.03 vs
0.37 ms). Roundings match the half kernels' (half inputs, fp32 accumulation, one output rounding).

Usage:
    ops.linear(x, weight, bias)  # dispatches to `linear` here when `fp32_pays_off(x)`
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from rapid_llm.config.dtypes import dtype_name

MIN_FP32_ROWS = 4


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


@lru_cache(maxsize=None)
def cpu_lacks_half_kernels(dtype: torch.dtype) -> bool:
    name = dtype_name(dtype)
    if name == "bfloat16":
        return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if name == "float16":
        return not torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def compute_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype to compute in for tensors of `dtype` on `device`."""
    return torch.float32 if device.type == "cpu" and cpu_lacks_half_kernels(dtype) else dtype


def fp32_pays_off(x: torch.Tensor) -> bool:
    """Whether a linear over `x` is faster in fp32 (see the module docstring)."""
    return x.shape[0] >= MIN_FP32_ROWS and compute_dtype(x.device, x.dtype) is torch.float32
