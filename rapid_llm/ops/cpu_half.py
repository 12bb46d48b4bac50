"""bf16/fp16 models on CPUs whose oneDNN has no native bf16/fp16 kernels (e.g. AVX2): compute in fp32.

There a bf16 GEMM is 4-10x slower than the same GEMM in fp32 and bf16 attention ~3x slower (one
thread, AVX2: [8, 256] x [256, 768] 0.53 vs 0.12 ms, [1024, 256] x [256, 768] 63 vs 6.4 ms, a decode
attention over 192 keys 1.03 vs 0.37 ms with the upcast). So linear layers keep their weights in fp32
(`weight_dtype`, applied once after loading) and the `cpu_fp32` linear casts activations up and the
result back; attention casts its inputs to `compute_dtype`. Activations, the KV cache and every
other op stay in the model dtype. The roundings match the half kernels' (half inputs, fp32
accumulation, one rounding of the output); only the summation order may differ.

Usage:
    weight = weight.to(weight_dtype(device, model_dtype))  # by the layer, after loading
    ops.linear(x, weight, bias)  # dispatches to `linear` here when the weight is fp32 and x is not
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from rapid_llm.config.dtypes import dtype_name
from rapid_llm.ops.registry import REGISTRY

LINEAR_BACKEND = "cpu_fp32"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x.to(weight.dtype), weight, None if bias is None else bias.to(weight.dtype)).to(x.dtype)


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


def weight_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype linear weights are kept in for a model of `dtype` on `device`."""
    if REGISTRY.override("linear") not in (None, LINEAR_BACKEND):
        return dtype  # pinned to an implementation that takes weights in the model dtype
    return compute_dtype(device, dtype)
