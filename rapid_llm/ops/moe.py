"""fused_moe torch reference: softmax top-k routing, then each expert's SwiGLU MLP on the tokens routed to it.

Routing and the weighted sum follow transformers' Qwen3-MoE exactly (softmax in fp32, top-k, optional
renormalisation, weights cast back; expert outputs scaled in the activation dtype and index_add_-ed in
expert order). Token slots are sorted by expert once, so only experts that received tokens run, each
on its tokens alone. The GEMMs go through `ops.linear`, so they dispatch like dense linear layers
(e.g. to `cpu_fp32` for half models on CPUs without half kernels, see cpu_half.py).
Usage: `fused_moe(x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I], top_k, renormalize)`.
"""

from __future__ import annotations

import torch

from rapid_llm import ops


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k] in the logits' dtype, expert ids [T, top_k]) as Qwen3-MoE's router picks them."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), experts


def fused_moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              top_k: int, renormalize: bool) -> torch.Tensor:
    weights, experts = route(router_logits, top_k, renormalize)
    slots = experts.flatten().argsort(stable=True)  # slot = token * top_k + k, grouped by expert
    counts = torch.bincount(experts.flatten(), minlength=w13.shape[0]).tolist()
    flat_weights = weights.flatten()
    output = torch.zeros_like(hidden_states)
    for expert, expert_slots in enumerate(slots.split(counts)):
        if expert_slots.numel() == 0:
            continue
        tokens = expert_slots // top_k
        hidden = ops.silu_and_mul(ops.linear(hidden_states.index_select(0, tokens), w13[expert]))
        hidden = ops.linear(hidden, w2[expert]) * flat_weights.index_select(0, expert_slots).unsqueeze(-1)
        output.index_add_(0, tokens, hidden)
    return output
