"""Qwen2-MoE: the Qwen2 block (q/k/v bias, switched by `qkv_bias`) with a sparse MoE MLP in every
`decoder_sparse_step`-th layer, plus a shared expert scaled by sigmoid(`shared_expert_gate`(x)).

Layers listed in `mlp_only_layers` (and the others when the step skips them) keep a dense Llama MLP of
`intermediate_size`, exactly as transformers assigns them; Qwen3-MoE places its layers by the same rule.
Expert checkpoint matrices (`mlp.experts.{e}.{gate,up,down}_proj`) are stacked into [E, ...] weights at load.
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.moe import RouterConfig, SparseMoeBlock
from rapid_llm.models.llama import LlamaForCausalLM, LlamaMLP, require_silu
from rapid_llm.models.weight_mapping import LLAMA_STACKED_PARAMS, expert_stacked_params


def is_sparse_layer(config: PretrainedConfig, layer_id: int) -> bool:
    return (layer_id not in config.mlp_only_layers and config.num_experts > 0
            and (layer_id + 1) % config.decoder_sparse_step == 0)


def qwen_moe_mlp(config: PretrainedConfig, layer_id: int, shared_expert: bool) -> nn.Module:
    """Layer `layer_id`'s MLP in Qwen2/3-MoE: sparse (with the gated shared expert if `shared_expert`) or dense."""
    if not is_sparse_layer(config, layer_id):
        return LlamaMLP(config)
    require_silu(config)
    shared_size = config.shared_expert_intermediate_size if shared_expert else 0
    return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size, RouterConfig.qwen_moe(config),
                          shared_intermediate_size=shared_size, shared_expert_gate=shared_expert)


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.stacked_params = expert_stacked_params(config.num_experts) + LLAMA_STACKED_PARAMS

    @staticmethod
    def attention_options(config: PretrainedConfig) -> dict[str, bool]:
        return {"qkv_bias": config.qkv_bias, "o_bias": False, "qk_norm": False}

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_id, shared_expert=True)
