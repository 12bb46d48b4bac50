"""The `cpu_amx` linear kernel: bf16 weights packed once for AMX / AVX-512 BF16 (csrc/amx_linear.cpp).

On a 2-core AMX machine, oneDNN's prepacked GEMM costs ~20 µs per call whatever the size at decode
shapes, while the packed weight streams through this kernel in 4-10 µs ([1, 256] x [256, 2048]: 10.5 vs
28.3 µs; [8, 768] x [768, 5120]: 157 vs 205 µs). Prefill-sized calls are within 0.6-1.9x of oneDNN's
(benchmarks/bench_ops.py). Weights whose out or in features are not multiples of 32 keep oneDNN's
format and kernel. Sums are fp32 in another order than oneDNN's, rounded once to bf16 (denormal results flush
to zero, as in the AMX and AVX-512 BF16 instructions).
Its gated form takes a merged [gate; up] weight and writes silu(gate) * up from the GEMM's epilogue, bit-identical
to the linear followed by silu_and_mul's cpu_cpp kernel (the MLP's widest tensor is never stored or reread).
Usage: chosen by priority on AMX CPUs for bf16 models, or `--op-backend linear=cpu_amx`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.cpp.jit import cpu_features
from rapid_llm.ops.linear_kernel import LinearKernel
from rapid_llm.ops.onednn_linear import ONEDNN_LINEAR

# The kernel's code is built only where the compiler targets all three (csrc/amx_linear.cpp).
AMX_KERNEL_FLAGS = ("amx_tile", "amx_bf16", "avx512_bf16")


def missing_amx_flags(features: str) -> list[str]:
    """Which of AMX_KERNEL_FLAGS a /proc/cpuinfo flags line lacks."""
    present = set(features.split())
    return [flag for flag in AMX_KERNEL_FLAGS if flag not in present]


def amx_missing(device_type: str, dtype: str) -> str | None:
    """The `available` condition: the extension builds here and this CPU and kernel run its AMX code."""
    reason = CPU_OPS.skip_reason()
    if reason is None and not CPU_OPS.load().amx_linear_supported():
        missing = missing_amx_flags(cpu_features())
        reason = (f"this CPU lacks {' and '.join(missing)} (the kernel needs {', '.join(AMX_KERNEL_FLAGS)})"
                  if missing else "the OS refuses this process AMX tile state (the CPU has every flag the "
                  "kernel needs)")
    return reason


class PackedLinear(LinearKernel):
    """A C++ kernel of the CPU extension over amx_pack_weight's layout, by name: amx_linear, avx512_linear;
    `gated_kernel` names its silu_and_mul form (the MLP's gate_up with the activation in its epilogue), if any."""

    def __init__(self, kernel: str, gated_kernel: str | None = None) -> None:
        self.kernel, self.gated_kernel = kernel, gated_kernel

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        out_features, in_features = weight.shape
        if out_features % 32 or in_features % 32:
            return ONEDNN_LINEAR.prepare(weight)
        return CPU_OPS.load().amx_pack_weight(weight)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if weight.dim() != 3:  # oneDNN's format, or a checkpoint-layout weight (F.linear)
            return ONEDNN_LINEAR(x, weight, bias)
        return _over_rows(getattr(CPU_OPS.load(), self.kernel), x, weight, bias)

    def fuses_silu_and_mul(self, weight: torch.Tensor) -> bool:
        return self.gated_kernel is not None and weight.dim() == 3

    def silu_and_mul_linear(self, x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
        return _over_rows(getattr(CPU_OPS.load(), self.gated_kernel), x, weight, bias)


def _over_rows(kernel: Callable[..., torch.Tensor], x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    """kernel over x's rows as one contiguous [rows, in] matrix, the result in x's leading shape."""
    if x.dim() == 2 and x.is_contiguous():  # the hot path's activations: no reshape and view back
        return kernel(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    out = kernel(rows if rows.is_contiguous() else rows.contiguous(), weight, bias)
    return out.view(*x.shape[:-1], out.shape[-1])


AMX_LINEAR = PackedLinear("amx_linear", gated_kernel="amx_silu_and_mul_linear")
