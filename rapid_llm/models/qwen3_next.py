"""Qwen3-Next: the Qwen2-MoE block (sparse MoE with a gated shared expert) whose layers `layer_types` calls
"linear_attention" are Gated DeltaNet (layers/gated_delta_net.py, a state-group layer) and whose others are gated
full attention: q_proj yields a query and an output gate per head, q/k RMSNorm per head, partial rotary.

Its RMSNorms scale by (1 + weight) (zero-centred, `ZeroCentredRMSNorm`, the shared block's `norm` here; the gated
norm inside Gated DeltaNet is a plain one). Tensor parallel ranks hold whole heads of every layer. The
checkpoint's multi-token-prediction weights (`mtp.*`) are not loaded.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.attention import Attention
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.gated_delta_net import GatedDeltaNet
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import QKVParallelLinear, RowParallelLinear
from rapid_llm.layers.rotary_embedding import RotaryEmbedding
from rapid_llm.models.llama import LlamaForCausalLM, attention_head_dim
from rapid_llm.models.qwen2_moe import qwen_moe_mlp
from rapid_llm.models.weight_mapping import (
    LLAMA_STACKED_PARAMS,
    MTP_REASON,
    SkippedKeys,
    StackedParam,
    expert_stacked_params,
)


class GatedAttention(nn.Module):
    """Full attention whose output is scaled by sigmoid(gate), the gate coming from q_proj beside each head's query."""

    def __init__(self, config: PretrainedConfig, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.head_dim = attention_head_dim(config)
        # q_proj's rows are [query | gate] per head: a QKV layer with twice the heads holds them as its q shard (a
        # tensor-parallel rank gets whole heads' pairs).
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, 2 * config.num_attention_heads,
                                          config.num_key_value_heads, bias=config.attention_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads // 2, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, config.hidden_size,
                                        bias=config.attention_bias)
        self.q_norm = ZeroCentredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        query_gate, key, value = self.qkv_proj(hidden_states).split([2 * size, kv_size, kv_size], dim=-1)
        query, gate = query_gate.reshape(-1, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        query = self.q_norm(query.reshape(-1, self.head_dim)).view(-1, size)
        key = self.k_norm(key.reshape(-1, self.head_dim)).view(-1, kv_size)
        rope = self.rotary_emb
        cos, sin = batch.once(rope, lambda: rope.cos_sin(batch.positions, batch.token_seq_lens, query.dtype))
        query, key = rope.rotate(query, key, cos, sin)
        output = self.attn(query, key, value, batch.metadata_for(self.attn))
        return self.o_proj(output * torch.sigmoid(gate.reshape(-1, size)))


class ZeroCentredRMSNorm(RMSNorm):
    """RMSNorm scaling by (1 + weight), in float32 and rounded once (as transformers' Qwen3-Next: a bf16 1 + w, or a
    bf16 product, would round where it does not)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = residual = x + residual
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float()))
        return normed.to(x.dtype) if residual is None else (normed.to(x.dtype), residual)


# The Gated DeltaNet layers' modules and parameters, which the checkpoint keeps under `linear_attn`.
GATED_DELTA_NET_NAMES = ("conv1d", "dt_bias", "A_log", "norm", "out_proj")
QWEN3_NEXT_PROJECTIONS = (StackedParam("self_attn.in_proj", "linear_attn.in_proj_qkvz", 0),
                          StackedParam("self_attn.in_proj", "linear_attn.in_proj_ba", 1))


class Qwen3NextForCausalLM(LlamaForCausalLM):
    norm = ZeroCentredRMSNorm
    gated_delta_net_grouped = True  # the checkpoint groups the projections per key head (layers/gated_delta_net.py)
    gated_delta_net_projections: tuple[StackedParam, ...] = QWEN3_NEXT_PROJECTIONS

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.stacked_params: tuple[StackedParam, ...] = (
            *self.expert_params(config), *LLAMA_STACKED_PARAMS,
            *self.gated_delta_net_projections,
            *(StackedParam(f"self_attn.{name}", f"linear_attn.{name}", None) for name in GATED_DELTA_NET_NAMES))
        self.skipped_checkpoint_keys = (SkippedKeys("mtp.*", r"mtp\..+", f"{MTP_REASON} (no proposer loads them)"),)

    @staticmethod
    def expert_params(config: PretrainedConfig) -> tuple[StackedParam, ...]:
        return expert_stacked_params(config.num_experts)

    @classmethod
    def make_attention(cls, config: PretrainedConfig, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        if config.layer_types[layer_id] == "linear_attention":
            return GatedDeltaNet(config, grouped=cls.gated_delta_net_grouped)
        return GatedAttention(config, rotary_emb)

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_id, shared_expert=True)
