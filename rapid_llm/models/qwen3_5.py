"""Qwen3.5 (text): Qwen3-Next's hybrid of Gated DeltaNet and gated full attention with flat Gated DeltaNet
projections (in_proj_qkv, and in_proj_z, in_proj_b, in_proj_a merged into one) and a dense MLP; Qwen3.5-MoE
puts a sparse MoE with a gated shared expert (top-k renormalised) in every layer.

Its rotary embedding is multimodal (mrope sections over time, height, width), but for text the three positions
are equal, so it is the plain partial rotary of rope_parameters. A checkpoint's multi-token-prediction weights
(`mtp.*`) are not loaded (no Qwen3.5 MTP proposer is built).
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.moe import RouterConfig, SparseMoeBlock
from rapid_llm.models.llama import LlamaMLP, require_silu
from rapid_llm.models.qwen3_next import Qwen3NextForCausalLM
from rapid_llm.models.weight_mapping import StackedParam, expert_stacked_params


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    gated_delta_net_grouped = False
    gated_delta_net_projections = (StackedParam("self_attn.in_proj_qkv", "linear_attn.in_proj_qkv", None),
                                   *(StackedParam("self_attn.in_proj_zba", f"linear_attn.in_proj_{name}", index)
                                     for index, name in enumerate("zba")))

    @staticmethod
    def expert_params(config: PretrainedConfig) -> tuple[StackedParam, ...]:
        return ()

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        return LlamaMLP(config)


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    @staticmethod
    def expert_params(config: PretrainedConfig) -> tuple[StackedParam, ...]:
        return expert_stacked_params(config.num_experts)

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        require_silu(config)
        router = RouterConfig(config.num_experts, config.num_experts_per_tok, renormalize=True,
                              weights_in_logits_dtype=True)
        return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size, router,
                              shared_intermediate_size=config.shared_expert_intermediate_size, shared_expert_gate=True)
