"""Qwen3-MoE: the Qwen3 block (q/k RMSNorm) with a sparse MoE MLP in every `decoder_sparse_step`-th layer.

Layers listed in `mlp_only_layers` (and the others when the step skips them) keep a dense Llama MLP of
`intermediate_size`, exactly as transformers assigns them. Expert checkpoint matrices
(`mlp.experts.{e}.{gate,up,down}_proj`) are stacked into the MoE layer's [E, ...] weights at load.
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.moe import SparseMoeBlock
from rapid_llm.models.llama import LlamaMLP, require_silu
from rapid_llm.models.qwen3 import Qwen3ForCausalLM
from rapid_llm.models.weight_mapping import LLAMA_STACKED_PARAMS, expert_stacked_params


def is_sparse_layer(config: PretrainedConfig, layer_id: int) -> bool:
    return (layer_id not in config.mlp_only_layers and config.num_experts > 0
            and (layer_id + 1) % config.decoder_sparse_step == 0)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.stacked_params = expert_stacked_params(config.num_experts) + LLAMA_STACKED_PARAMS

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        if not is_sparse_layer(config, layer_id):
            return LlamaMLP(config)
        require_silu(config)
        return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                              config.num_experts_per_tok, config.norm_topk_prob)
