"""The `cpu_amx` and `cpu_avx512` fused_moe: stacked experts packed once for the packed linear kernels
(amx_linear on AMX CPUs, avx512_linear on AVX-512 BF16 CPUs without AMX), one C++ call per layer.

`prepare` packs every expert once into amx_pack_weight's layout, stacked: w13 [E, 2I/16, H/2, 32] and
w2 [E, H/16, I/2, 32], so `w13[e]` is a contiguous packed weight. A call is csrc/amx_moe.cpp: the
reference's expert loop (gather, GEMM, silu_and_mul, GEMM, weighted scatter-add) in C++, since its ~10 ATen
calls per expert cost 4-5x the GEMMs at decode sizes. Rounding points are the reference's (moe.py), so
only the GEMMs' fp32 summation order differs from it. With `swiglu_limit` (DeepSeek-V4) the loop stays in
Python (`expert_loop`, still over the packed GEMMs). Widths that are not multiples of 32 keep the checkpoint
layout and the reference.
Usage: chosen by priority for bf16 models (cpu_amx on AMX CPUs, else cpu_avx512 on AVX-512 BF16 ones), or
`--op-backend fused_moe=cpu_amx` / `=cpu_avx512`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.moe import expert_loop
from rapid_llm.ops.moe import fused_moe as reference_fused_moe
from rapid_llm.ops.moe_kernel import MoEKernel

_PACKED_DIMS = 4  # [E, N/16, K/2, 32]; the checkpoint layout is [E, N, K]


def _packed(weights: torch.Tensor) -> torch.Tensor:
    pack = CPU_OPS.load().amx_pack_weight
    return torch.stack([pack(weight) for weight in weights])


class PackedMoE(MoEKernel):
    def __init__(self, linear: str) -> None:
        """`linear`: the packed linear kernel of the CPU extension its GEMMs use (amx_linear, avx512_linear)."""
        self.linear_kernel = linear

    def linear(self, rows: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return getattr(CPU_OPS.load(), self.linear_kernel)(rows, packed, None)

    def prepare(self, w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if w13.dim() == _PACKED_DIMS or w13.dtype != torch.bfloat16 or w2.shape[1] % 32 or w2.shape[2] % 32:
            return w13, w2  # already packed, or the reference's checkpoint layout
        return _packed(w13), _packed(w2)

    def __call__(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 w13: torch.Tensor, w2: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
        if w13.dim() != _PACKED_DIMS:
            return reference_fused_moe(hidden_states, topk_weights, topk_ids, w13, w2, swiglu_limit)
        if swiglu_limit is not None:
            return expert_loop(hidden_states, topk_weights, topk_ids, w13, w2, swiglu_limit, self.linear)
        rows = hidden_states if hidden_states.is_contiguous() else hidden_states.contiguous()
        return CPU_OPS.load().packed_fused_moe(rows, topk_weights, topk_ids, w13, w2,
                                               self.linear_kernel == "amx_linear")


AMX_MOE = PackedMoE("amx_linear")
AVX512_MOE = PackedMoE("avx512_linear")
