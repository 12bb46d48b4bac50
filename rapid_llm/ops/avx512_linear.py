"""The `cpu_avx512` linear kernel: bf16 weights packed once (amx_pack_weight's layout) for AVX-512 BF16 CPUs
without AMX (csrc/avx512_linear.cpp), e.g. AMD EPYC since Zen 4.

Where AMX is missing, oneDNN's bf16 GEMM reads a decode step's weights at a fraction of the memory bandwidth;
this kernel's dot-product loop streams each packed weight row once per pass of up to 6 input rows. Sums are fp32 in
another order than oneDNN's, rounded once to bf16. Weights whose out or in features are not multiples of 32
keep oneDNN's format and kernel (PackedLinear.prepare). Its gated form writes the MLP's silu(gate) * up from the
epilogue, as cpu_amx's does.
Usage: chosen by priority on AVX-512 BF16 CPUs without AMX for bf16 models, or `--op-backend linear=cpu_avx512`.
"""

from __future__ import annotations

from rapid_llm.ops.amx_linear import PackedLinear
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.cpp.jit import cpu_features

AVX512_KERNEL_FLAGS = ("avx512f", "avx512_bf16")


def avx512_missing(device_type: str, dtype: str) -> str | None:
    """The `available` condition: the extension builds here with the kernel's AVX-512 BF16 code."""
    reason = CPU_OPS.skip_reason()
    if reason is None and not CPU_OPS.load().avx512_linear_supported():
        missing = [flag for flag in AVX512_KERNEL_FLAGS if flag not in cpu_features().split()]
        reason = (f"this CPU lacks {' and '.join(missing)} (the kernel needs {', '.join(AVX512_KERNEL_FLAGS)})"
                  if missing else "the extension was built without AVX512-BF16 code (the compiler does not target it)")
    return reason


AVX512_LINEAR = PackedLinear("avx512_linear", gated_kernel="avx512_silu_and_mul_linear")
