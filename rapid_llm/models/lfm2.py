"""LFM2: Llama's pre-norm block where the layers `layer_types` calls "conv" mix tokens with a gated short
convolution (layers/short_conv.py, a state-group layer) and the others attend with per-head q/k RMSNorm.

The checkpoint's names map onto the shared block's (`LFM2_STACKED_PARAMS`: operator_norm/ffn_norm, feed_forward
w1/w3/w2, attention out_proj and q/k_layernorm, the conv layers' modules under `self_attn`, the final
embedding_norm); the MLP's width follows LFM2's auto-adjust rule (`lfm2_ffn_size`).
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.mlp import GatedMLP
from rapid_llm.layers.rotary_embedding import RotaryEmbedding
from rapid_llm.layers.short_conv import ShortConv
from rapid_llm.models.llama import LlamaForCausalLM
from rapid_llm.models.weight_mapping import StackedParam

LFM2_STACKED_PARAMS: tuple[StackedParam, ...] = (
    StackedParam("qkv_proj", "q_proj", "q"),
    StackedParam("qkv_proj", "k_proj", "k"),
    StackedParam("qkv_proj", "v_proj", "v"),
    StackedParam("self_attn.o_proj", "self_attn.out_proj", None),
    StackedParam("self_attn.q_norm", "self_attn.q_layernorm", None),
    StackedParam("self_attn.k_norm", "self_attn.k_layernorm", None),
    StackedParam("self_attn.in_proj", "conv.in_proj", None),
    StackedParam("self_attn.out_proj", "conv.out_proj", None),
    StackedParam("self_attn.conv", "conv.conv", None),
    StackedParam("mlp.gate_up_proj", "feed_forward.w1", 0),
    StackedParam("mlp.gate_up_proj", "feed_forward.w3", 1),
    StackedParam("mlp.down_proj", "feed_forward.w2", None),
    StackedParam("input_layernorm", "operator_norm", None),
    StackedParam("post_attention_layernorm", "ffn_norm", None),
    StackedParam("model.norm", "model.embedding_norm", None),
)


def lfm2_ffn_size(config: PretrainedConfig) -> int:
    """The MLP width: with `block_auto_adjust_ff_dim`, 2/3 of intermediate_size, times the multiplier, rounded up
    to a multiple of `block_multiple_of` (as transformers' Lfm2MLP)."""
    size = config.intermediate_size
    if config.block_auto_adjust_ff_dim:
        size = int(2 * size / 3)
        if config.block_ffn_dim_multiplier is not None:
            size = int(config.block_ffn_dim_multiplier * size)
            size = config.block_multiple_of * -(-size // config.block_multiple_of)
    return size


class Lfm2ForCausalLM(LlamaForCausalLM):
    stacked_params = LFM2_STACKED_PARAMS

    def __init__(self, config: PretrainedConfig) -> None:
        # LFM2 names RMSNorm's epsilon `norm_eps`; the shared block reads `rms_norm_eps`.
        config.rms_norm_eps = config.norm_eps
        super().__init__(config)

    @staticmethod
    def attention_options(config: PretrainedConfig) -> dict[str, bool]:
        return {"qkv_bias": False, "o_bias": False, "qk_norm": True}

    @classmethod
    def make_attention(cls, config: PretrainedConfig, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        if config.layer_types[layer_id] == "conv":
            return ShortConv(config.hidden_size, config.conv_L_cache, config.conv_bias)
        return super().make_attention(config, layer_id, rotary_emb)

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        return GatedMLP(config.hidden_size, lfm2_ffn_size(config))
