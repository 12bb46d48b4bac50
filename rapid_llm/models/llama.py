"""Llama, and the decoder block the Llama family (Mistral, Qwen2, Qwen3) shares.

Family members differ only in switches: biases on the projections and per-head q/k RMSNorm.
They subclass `LlamaForCausalLM` and set those switches, so each family file stays a few lines;
a model with another MLP per layer (MoE) overrides `make_mlp`, one with another attention (MLA)
`make_rope` and `make_attention`.
"""

from __future__ import annotations

from itertools import islice
from typing import Callable

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.config.model_config import attention_head_dim, attention_kv_heads
from rapid_llm.layers.attention import Attention
from rapid_llm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import QKVParallelLinear, RowParallelLinear
from rapid_llm.layers.mlp import GatedMLP
from rapid_llm.layers.rotary_embedding import RotaryEmbedding, get_rope
from rapid_llm.models.pipeline_split import StageElsewhere, StageSplit
from rapid_llm.models.weight_mapping import LLAMA_STACKED_PARAMS, StackedParam


def layer_sliding_window(config: PretrainedConfig, layer_id: int) -> int | None:
    """Per-layer window from `layer_types` (Qwen2/3), else the model-wide `sliding_window` (Mistral)."""
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if layer_types is not None:
        return window if layer_types[layer_id] == "sliding_attention" else None
    return window


class LlamaAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_id: int, rotary_emb: RotaryEmbedding, qkv_bias: bool,
                 o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        num_heads = config.num_attention_heads
        head_dim = attention_head_dim(config)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, num_heads, attention_kv_heads(config),
                                          bias=qkv_bias)
        self.o_proj = RowParallelLinear(num_heads * head_dim, config.hidden_size, bias=o_bias)
        local_heads, local_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.split_sizes = [local_heads * head_dim, local_kv_heads * head_dim, local_kv_heads * head_dim]
        self.head_dim = head_dim
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if qk_norm else None
        self.rotary_emb = rotary_emb
        self.attn = Attention(local_heads, local_kv_heads, head_dim, head_dim**-0.5,
                              layer_sliding_window(config, layer_id))

    def head_normed(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k through their per-head norms (Qwen3's), or as they are without them."""
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        return q, k

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split_with_sizes(self.split_sizes, dim=-1)
        q, k = self.head_normed(q, k)
        rope = self.rotary_emb
        cos, sin = batch.once(rope, lambda: rope.cos_sin(batch.positions, batch.token_seq_lens, q.dtype))
        q, k = rope.rotate(q, k, cos, sin)
        return self.o_proj(self.attn(q, k, v, batch.metadata_for(self.attn)))


def require_silu(config: PretrainedConfig) -> None:
    if config.hidden_act != "silu":
        raise ValueError(f"hidden_act {config.hidden_act!r} is not supported; Llama-family models use 'silu'")


class LlamaMLP(GatedMLP):
    def __init__(self, config: PretrainedConfig) -> None:
        require_silu(config)
        super().__init__(config.hidden_size, config.intermediate_size, bias=getattr(config, "mlp_bias", False))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block around an attention module, called (hidden_states, batch), and an MLP."""

    def __init__(self, config: PretrainedConfig, self_attn: nn.Module, mlp: nn.Module,
                 norm: type[RMSNorm] = RMSNorm) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = norm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = norm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(hidden_states, batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


MakeAttention = Callable[[PretrainedConfig, int, RotaryEmbedding], nn.Module]
MakeMLP = Callable[[PretrainedConfig, int], nn.Module]


class LlamaModel(nn.Module):
    """The decoder stack, or this pipeline stage's part of it (models/pipeline_split.py): a stage after the first
    starts from the previous one's hidden states and residual, one before the last returns its own."""

    def __init__(self, config: PretrainedConfig, rotary_emb: RotaryEmbedding, make_attention: MakeAttention,
                 make_mlp: MakeMLP, norm: type[RMSNorm] = RMSNorm) -> None:
        super().__init__()
        self.split = split = StageSplit.of(config)
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, config.hidden_size) if split.embeds
                             else StageElsewhere())
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, make_attention(config, i, rotary_emb), make_mlp(config, i), norm)
            if split.holds(i) else StageElsewhere()
            for i in range(config.num_hidden_layers)
        )
        self.norm = norm(config.hidden_size, config.rms_norm_eps) if split.is_last else StageElsewhere()

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.intermediate is None:
            hidden_states, residual = self.embed_tokens(batch.input_ids), None
        else:
            hidden_states, residual = batch.intermediate.unbind(0)
        # islice, not a slice: slicing a ModuleList builds a new ModuleList on every forward.
        for layer in islice(self.layers, self.split.layers.start, self.split.layers.stop):
            hidden_states, residual = layer(hidden_states, residual, batch)
        if not self.split.is_last:
            return StageSplit.pack(hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """Family members override `attention_options` (switches), `make_mlp` (MoE), `norm` (Qwen3-Next's zero-centred
    RMSNorm), or `make_rope` and `make_attention` (another attention, e.g. DeepSeek's MLA)."""

    stacked_params: tuple[StackedParam, ...] = LLAMA_STACKED_PARAMS
    norm: type[RMSNorm] = RMSNorm  # the decoder layers' and the final norm

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        # One cos/sin table for all layers: it can be tens of MiB at long context.
        self.model = LlamaModel(config, self.make_rope(config), self.make_attention, self.make_mlp, self.norm)
        split = self.model.split
        self.skipped_checkpoint_keys = split.skipped_keys(config.num_hidden_layers)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size) if split.is_last else StageElsewhere()
        if config.tie_word_embeddings and split.is_last:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def attention_options(config: PretrainedConfig) -> dict[str, bool]:
        bias = getattr(config, "attention_bias", False)
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": False}

    @staticmethod
    def make_rope(config: PretrainedConfig) -> RotaryEmbedding:
        return get_rope(config, attention_head_dim(config))

    @classmethod
    def make_attention(cls, config: PretrainedConfig, layer_id: int, rotary_emb: RotaryEmbedding) -> nn.Module:
        return LlamaAttention(config, layer_id, rotary_emb, **cls.attention_options(config))

    @staticmethod
    def make_mlp(config: PretrainedConfig, layer_id: int) -> nn.Module:
        return LlamaMLP(config)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)
