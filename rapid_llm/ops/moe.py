"""fused_moe torch reference: each expert's SwiGLU MLP on the tokens routed to it, weighted and summed.

Routing is done by the caller (rapid_llm/layers/moe/router.py), so every router variant shares this op.
The weighted sum follows transformers: each expert's output is multiplied by its routing weight in the
weights' dtype (the model dtype for Qwen, fp32 for Mixtral and DeepSeek), rounded to the activation
dtype and index_add_-ed in expert order. Token slots are sorted by expert once, so only experts that
received tokens run, each on its tokens alone. The GEMMs go through `ops.linear`, so they dispatch like
dense linear layers (e.g. to `cpu_fp32` for half models on CPUs without half kernels, see cpu_half.py).
`swiglu_limit` (DeepSeek-V4) clamps gate and up before the activation (`clamped_silu_and_mul`).
As a kernel (moe_kernel.py) it is `TORCH_MOE`, on the checkpoint layout.
Usage: `fused_moe(x [T, H], topk_weights [T, k], topk_ids [T, k], w13 [E, 2I, H], w2 [E, H, I])`.
"""

from __future__ import annotations

from typing import Callable

import torch

from rapid_llm import ops
from rapid_llm.ops.activation import clamped_silu_and_mul
from rapid_llm.ops.moe_kernel import CheckpointLayoutMoE


Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def expert_loop(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, swiglu_limit: float | None, linear: Linear) -> torch.Tensor:
    """The reference's loop with `linear(rows, w13[e] or w2[e])` as each GEMM (cpu_amx's packed slices reuse it)."""
    top_k = topk_ids.shape[1]
    slots = topk_ids.flatten().argsort(stable=True)  # slot = token * top_k + k, grouped by expert
    counts = torch.bincount(topk_ids.flatten(), minlength=w13.shape[0]).tolist()
    flat_weights = topk_weights.flatten()
    output = torch.zeros_like(hidden_states)
    for expert, expert_slots in enumerate(slots.split(counts)):
        if expert_slots.numel() == 0:
            continue
        tokens = expert_slots // top_k
        gate_up = linear(hidden_states.index_select(0, tokens), w13[expert])
        hidden = ops.silu_and_mul(gate_up) if swiglu_limit is None else clamped_silu_and_mul(gate_up, swiglu_limit)
        hidden = linear(hidden, w2[expert]) * flat_weights.index_select(0, expert_slots).unsqueeze(-1)
        output.index_add_(0, tokens, hidden.to(output.dtype))
    return output


def fused_moe(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
    return expert_loop(hidden_states, topk_weights, topk_ids, w13, w2, swiglu_limit, ops.linear)

TORCH_MOE = CheckpointLayoutMoE(fused_moe)
