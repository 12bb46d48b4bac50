"""DeepSeek-V2 and V3: the Llama decoder block with multi-head latent attention (MLA).

MLA compresses K/V into one latent per token (`kv_a_proj_with_mqa` -> kv_a_layernorm), which is all the
paged cache keeps (plus the rotated rope key shared by all heads); `kv_b_proj` turns latents back into
per-head nope-keys and values inside the `mla_attention` backend. The query is low-rank
(q_a_proj -> q_a_layernorm -> q_b_proj) or, when `q_lora_rank` is None (V2-Lite), a plain `q_proj`. Only
the last `qk_rope_head_dim` dims of q/k are rotated: interleaved pairs (V2 always, V3 with
`rope_interleave`), else neox. YaRN's mscale multiplies the cos/sin table and, squared with
`mscale_all_dim`, the softmax scale, as transformers does. Layers from `first_k_dense_replace` on are
mixture-of-experts layers (`SparseMoeBlock.deepseek`: routed experts plus shared experts) with V2's
softmax router ("greedy" / "group_limited_greedy") or V3's sigmoid one with e_score_correction_bias.
V3 checkpoints carry MTP layers after the last decoder layer; the target skips them (`mtp_checkpoint_keys`), the
`mtp` speculative proposer (`spec_decode/mtp.py`) loads them.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.config.model_config import rope_parameters
from rapid_llm.distributed import get_tp_size
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear
from rapid_llm.layers.mla_attention import MLAAttention
from rapid_llm.layers.moe import RouterConfig, SparseMoeBlock
from rapid_llm.layers.rotary_embedding import RotaryEmbedding, get_rope, yarn_mscale
from rapid_llm.models.llama import LlamaForCausalLM, LlamaMLP, require_silu
from rapid_llm.models.weight_mapping import (
    GATE_UP_STACKED_PARAMS,
    SkippedKeys,
    expert_stacked_params,
    mtp_layer_keys,
)
from rapid_llm.ops.attention import MLADims


def mla_softmax_scale(config: PretrainedConfig) -> float:
    """1/sqrt(qk_head_dim), times yarn's mscale(factor, mscale_all_dim) squared when the rope is scaled."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim")
    if params["rope_type"] != "default" and mscale_all_dim:
        mscale = yarn_mscale(params["factor"], mscale_all_dim)
        scale *= mscale * mscale
    return scale


def mtp_checkpoint_keys(config: PretrainedConfig) -> tuple[SkippedKeys, ...]:
    """V3's `num_nextn_predict_layers` MTP layers, stored as decoder layers `model.layers.{num_hidden_layers + i}`
    (a full layer plus embed_tokens, enorm, hnorm, eh_proj, shared_head.norm/head); V2 configs have none."""
    return mtp_layer_keys(config, "model.layers.{num_hidden_layers + i}.* for i < num_nextn_predict_layers",
                          r"model\.layers\.", "the `mtp` speculative proposer loads them",
                          first=config.num_hidden_layers)


class KVBProjection(ColumnParallelLinear):
    """kv_b_proj (latent -> per-head nope-key and value rows), sharded by head like q. It is never called
    as a layer: MLA backends read its weight in checkpoint layout (to expand the latent history or fold it
    into the query and output), so it keeps that layout instead of a linear kernel's format."""

    def prepare_weights(self) -> None:
        """Nothing to prepare: the weight stays as loaded."""


class DeepseekMLA(nn.Module):
    def __init__(self, config: PretrainedConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        num_heads, hidden_size, bias = config.num_attention_heads, config.hidden_size, config.attention_bias
        if num_heads % get_tp_size():
            raise ValueError(f"num_attention_heads ({num_heads}) must divide over {get_tp_size()} "
                             "tensor-parallel ranks")
        self.num_heads = num_heads // get_tp_size()
        self.dims = MLADims(config.kv_lora_rank, config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim)
        self.q_lora_rank = config.q_lora_rank
        query_size = num_heads * self.dims.qk_head_dim
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden_size, query_size)
        else:
            self.q_a_proj = LinearBase(hidden_size, self.q_lora_rank, bias=bias)
            # transformers builds both low-rank norms with its default eps (1e-6), not config.rms_norm_eps.
            self.q_a_layernorm = RMSNorm(self.q_lora_rank)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, query_size)
        self.kv_a_proj_with_mqa = LinearBase(hidden_size, self.dims.latent_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.dims.kv_lora_rank)
        self.kv_b_proj = KVBProjection(self.dims.kv_lora_rank,
                                       num_heads * (self.dims.qk_nope_head_dim + self.dims.v_head_dim))
        self.o_proj = RowParallelLinear(num_heads * self.dims.v_head_dim, hidden_size, bias=bias)
        self.rotary_emb = rotary_emb
        self.attn = MLAAttention(self.num_heads, self.dims, mla_softmax_scale(config))

    def _query(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.q_lora_rank is None:
            return self.q_proj(hidden_states)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        dims = self.dims
        query = self._query(hidden_states).view(-1, self.num_heads, dims.qk_head_dim)
        query_nope, query_rope = query.split([dims.qk_nope_head_dim, dims.qk_rope_head_dim], dim=-1)
        compressed, key_rope = self.kv_a_proj_with_mqa(hidden_states).split(
            [dims.kv_lora_rank, dims.qk_rope_head_dim], dim=-1)
        rope = self.rotary_emb
        cos, sin = batch.once(rope, lambda: rope.cos_sin(batch.positions, batch.token_seq_lens, query.dtype))
        query_rope, key_rope = rope.rotate(query_rope, key_rope, cos, sin)
        query = torch.cat((query_nope, query_rope), dim=-1)
        latent = torch.cat((self.kv_a_layernorm(compressed), key_rope), dim=-1)
        return self.o_proj(self.attn(query, latent, self.kv_b_proj.weight, batch.attention))


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        # Routed experts' matrices stack into w13/w2; dense and shared-expert MLPs stack gate/up.
        self.stacked_params = expert_stacked_params(config.n_routed_experts) + GATE_UP_STACKED_PARAMS
        self.skipped_checkpoint_keys = (*self.skipped_checkpoint_keys, *mtp_checkpoint_keys(config))

    @staticmethod
    def make_rope(config: PretrainedConfig) -> RotaryEmbedding:
        # V2 has no switch (always interleaved); V3's rope_interleave=False selects neox.
        interleaved = getattr(config, "rope_interleave", True)
        return get_rope(config, config.qk_rope_head_dim, is_neox_style=not interleaved)

    @classmethod
    def make_attention(cls, config: PretrainedConfig, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        return DeepseekMLA(config, rotary_emb)

    @staticmethod
    def router(config: PretrainedConfig) -> RouterConfig:
        return RouterConfig.deepseek_v2(config)

    @classmethod
    def make_mlp(cls, config: PretrainedConfig, layer_id: int) -> nn.Module:
        if layer_id < config.first_k_dense_replace:
            return LlamaMLP(config)
        require_silu(config)
        return SparseMoeBlock.deepseek(config, cls.router(config))


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """V2 plus the `rope_interleave` switch (read by make_rope) and the sigmoid "noaux_tc" router."""

    @staticmethod
    def router(config: PretrainedConfig) -> RouterConfig:
        return RouterConfig.deepseek_v3(config)
