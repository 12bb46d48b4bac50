"""The `cpu_amx` fused_moe: the torch reference's expert loop with each GEMM through the cpu_amx linear kernel.

`prepare` packs every expert once into amx_linear's layout, stacked: w13 [E, 2I/16, H/2, 32] and
w2 [E, H/16, I/2, 32], so `w13[e]` is a contiguous packed weight. The reference instead calls oneDNN /
F.linear on checkpoint-layout slices, paying a reorder and ~20 µs of call overhead per expert per step.
Rounding points are the reference's (moe.py `expert_loop`): each GEMM rounded to bf16, silu_and_mul, the
routing weight in its own dtype, index_add_ in expert order; only the GEMMs' fp32 summation order differs.
Widths that are not multiples of 32 keep the checkpoint layout and the reference. `swiglu_limit` works.
Usage: chosen by priority on AMX CPUs for bf16 models, or `--op-backend fused_moe=cpu_amx`.
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


def _amx_linear(rows: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return CPU_OPS.load().amx_linear(rows, packed, None)


class AMXMoE(MoEKernel):
    def prepare(self, w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if w13.dim() == _PACKED_DIMS or w13.dtype != torch.bfloat16 or w2.shape[1] % 32 or w2.shape[2] % 32:
            return w13, w2  # already packed, or the reference's checkpoint layout
        return _packed(w13), _packed(w2)

    def __call__(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 w13: torch.Tensor, w2: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
        if w13.dim() != _PACKED_DIMS:
            return reference_fused_moe(hidden_states, topk_weights, topk_ids, w13, w2, swiglu_limit)
        return expert_loop(hidden_states, topk_weights, topk_ids, w13, w2, swiglu_limit, _amx_linear)


AMX_MOE = AMXMoE()
