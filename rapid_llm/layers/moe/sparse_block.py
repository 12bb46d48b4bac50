"""The sparse MoE MLP of a decoder layer: a router (`gate`), routed experts, and optionally shared experts.

Shared experts are a dense gated MLP every token goes through, added to the routed sum. Two kinds exist
and their checkpoint names differ, so the block keeps each under its checkpoint's name: Qwen2-MoE's
`shared_expert`, scaled per token by sigmoid(`shared_expert_gate`(x)), and DeepSeek's plain
`shared_experts` (n_shared_experts of them, one MLP of n_shared_experts * moe_intermediate_size).
On several ranks the routed experts (split by TP, or partitioned by EP: ep_experts.py) and the shared experts
(split by TP) each leave a partial sum, so the block all-reduces once, after adding them. Built on an attention rank
of attention-FFN disaggregation, the block holds nothing and hands its input to the FFN ranks
(distributed/ffn_exchange.py), which build it whole.
Usage: `SparseMoeBlock(hidden, moe_intermediate, RouterConfig.qwen_moe(config), shared_intermediate_size=
config.shared_expert_intermediate_size, shared_expert_gate=True)(x [T, H])`, or
`SparseMoeBlock.deepseek(config, RouterConfig.deepseek_v3(config))`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.distributed import tp_all_reduce
from rapid_llm.distributed.expert_parallel import expert_parallel_layout
from rapid_llm.distributed.ffn_exchange import ATTENTION, afd_role, exchange
from rapid_llm.layers.linear import LinearBase
from rapid_llm.layers.mlp import GatedMLP
from rapid_llm.layers.moe.ep_experts import ExpertParallelExperts
from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.layers.moe.router import Router, RouterConfig


class SparseMoeBlock(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, router: RouterConfig,
                 shared_intermediate_size: int = 0, shared_expert_gate: bool = False) -> None:
        super().__init__()
        # Attention-FFN disaggregation's attention ranks: the FFN ranks hold and compute this block.
        self.remote = afd_role() == ATTENTION
        if self.remote:
            self.checkpoint_elsewhere = "attention-FFN disaggregation: the FFN ranks load them"
            return
        if shared_expert_gate and shared_intermediate_size <= 0:
            raise ValueError("a shared_expert_gate needs a shared expert: shared_expert_intermediate_size must be > 0")
        self.gate = Router(hidden_size, router)
        layout = expert_parallel_layout()
        self.experts = (FusedExperts(router.num_experts, hidden_size, intermediate_size) if layout is None
                        else ExpertParallelExperts(router.num_experts, hidden_size, intermediate_size, layout))
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: LinearBase | None = None
        self.shared_experts: GatedMLP | None = None
        if shared_expert_gate:
            self.shared_expert = GatedMLP(hidden_size, shared_intermediate_size, reduce_results=False)
            self.shared_expert_gate = LinearBase(hidden_size, 1, bias=False)
        elif shared_intermediate_size > 0:
            self.shared_experts = GatedMLP(hidden_size, shared_intermediate_size, reduce_results=False)

    @classmethod
    def deepseek(cls, config: PretrainedConfig, router: RouterConfig) -> SparseMoeBlock:
        """DeepSeek-V2/V3's MoE layer, given the model's router (`RouterConfig.deepseek_v2/v3(config)`)."""
        return cls(config.hidden_size, config.moe_intermediate_size, router,
                   shared_intermediate_size=config.moe_intermediate_size * (config.n_shared_experts or 0))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.remote:
            return exchange(hidden_states)
        output = self.experts(hidden_states, *self.gate(hidden_states))
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            gate = torch.sigmoid(self.shared_expert_gate(hidden_states))
            output = output + gate * self.shared_expert(hidden_states)
        elif self.shared_experts is not None:
            output = output + self.shared_experts(hidden_states)
        return tp_all_reduce(output)
