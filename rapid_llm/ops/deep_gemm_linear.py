"""DeepGEMM (`deep_gemm`, optional) as the bf16 `linear` on Hopper or newer: a thin adapter.

`deep_gemm.bf16_gemm_nt(a, b, d)` computes d = a @ b.T, which is `F.linear`'s layout (weight [N, K]);
the bias is added afterwards. DeepGEMM JIT-compiles a kernel per shape on its first call (its own cache,
`$HOME/.deep_gemm`). Its fp8 GEMMs (`fp8_gemm_nt`) need fp8 weights and scales, which no model here
loads yet. Untested: no machine this was written on had a GPU or the library; only its selection is
tested (with a stand-in module). Registered below torch_ref (cuBLAS) until a GPU check shows a gain.
Usage: `--op-backend linear=deep_gemm`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.linear_kernel import LinearKernel

try:
    import deep_gemm
except ImportError as error:  # optional: the registry selects this module only where deep_gemm is found
    raise ImportError(f"this adapter needs the optional library deep_gemm (DeepGEMM): {error}") from error


class DeepGemmLinear(LinearKernel):
    """The checkpoint layout, made contiguous once (DeepGEMM reads [N, K] row-major)."""

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.contiguous()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
        deep_gemm.bf16_gemm_nt(rows, weight.contiguous(), out)
        if bias is not None:
            out += bias
        return out.view(*x.shape[:-1], weight.shape[0])


DEEP_GEMM_LINEAR = DeepGemmLinear()
