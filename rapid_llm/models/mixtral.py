"""Mixtral: Mistral's attention (optional model-wide sliding window) with a sparse MoE MLP in every layer.

The router always renormalises its softmax top-k and keeps the weights in fp32, as transformers does.
The checkpoint calls the MoE module `block_sparse_moe` and the experts' gate/up/down `w1`/`w3`/`w2`; they
load into the decoder layer's `mlp` (router `gate`, experts stacked into [E, ...] weights).
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.moe import RouterConfig, SparseMoeBlock
from rapid_llm.models.llama import LlamaForCausalLM, require_silu
from rapid_llm.models.weight_mapping import LLAMA_STACKED_PARAMS, StackedParam, expert_stacked_params


class MixtralForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        experts = expert_stacked_params(config.num_local_experts, "block_sparse_moe.experts", "mlp.experts",
                                        ("w1", "w3", "w2"))
        router = StackedParam("mlp.gate", "block_sparse_moe.gate", None)
        self.stacked_params = (*experts, router, *LLAMA_STACKED_PARAMS)

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        require_silu(config)
        return SparseMoeBlock(config.hidden_size, config.intermediate_size, RouterConfig.mixtral(config))
