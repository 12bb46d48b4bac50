"""Qwen3-MoE: the Qwen3 block (q/k RMSNorm) with Qwen2-MoE's layer placement and router, no shared expert.

Layers listed in `mlp_only_layers` (and the others when `decoder_sparse_step` skips them) keep a dense Llama
MLP of `intermediate_size`, exactly as transformers assigns them. Expert checkpoint matrices
(`mlp.experts.{e}.{gate,up,down}_proj`) are stacked into the MoE layer's [E, ...] weights at load.
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from rapid_llm.models.qwen2_moe import qwen_moe_mlp
from rapid_llm.models.qwen3 import Qwen3ForCausalLM
from rapid_llm.models.weight_mapping import LLAMA_STACKED_PARAMS, expert_stacked_params


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.stacked_params = expert_stacked_params(config.num_experts) + LLAMA_STACKED_PARAMS

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_id, shared_expert=False)
