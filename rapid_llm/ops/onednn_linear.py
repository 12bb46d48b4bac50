"""The `onednn` linear kernel: bf16/fp16 weights repacked once into oneDNN's blocked layout (CPU).

Where oneDNN has native half kernels (AVX-512 BF16/FP16, AMX), a GEMM over a prepacked weight skips
the per-call reorder that `F.linear` pays: on a 2-core AMX machine, bf16 [1, 768] x [768, 5120] takes
0.19 ms instead of 0.34 ms and [128, 256] x [256, 2048] 0.08 instead of 0.11 ms (benchmarks/bench_ops.py).
bf16 results equal `F.linear`'s bit for bit; fp16 one-row products may differ in the last bit. A weight still in the checkpoint layout (an
unprepared call through `ops.linear`, e.g. a MoE expert slice) goes to `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rapid_llm.ops.cpu_half import cpu_lacks_half_kernels
from rapid_llm.ops.linear_kernel import LinearKernel


def onednn_half_kernels_missing(device_type: str, dtype: str) -> str | None:
    """The `available` condition: native half kernels are what make the packed layout pay off."""
    if cpu_lacks_half_kernels(getattr(torch, dtype)):
        return f"this CPU's oneDNN has no native {dtype} kernels"
    return None


class OneDNNLinear(LinearKernel):
    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not weight.is_mkldnn:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


ONEDNN_LINEAR = OneDNNLinear()
