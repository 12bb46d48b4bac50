"""DeepSeek-V4 (transformers' `deepseek_v4`), and DeepSeek-V4.1-Flash where its config maps onto it.

Blocks: `DeepseekV4Attention` (layers/dsv4_attention.py: shared-KV MQA with sinks, sliding window plus
compressed KV per `layer_types`), a MoE MLP per layer (`mlp_layer_types`: "moe" routes by biased
sqrt(softplus) scores, "hash_moe" by the checkpoint's token -> experts table), with a clamped-SwiGLU shared
expert, and hyper-connections (`hc_mult` residual streams, layers/hyper_connection.py) instead of the plain
residual. Module names follow the checkpoint (DeepSeek's own: attn.wq_a, ffn.experts.{e}.w1, hc_attn_fn...),
so the weight mapping only stacks experts and renames the few names transformers' layout differs in. The
checkpoint's MTP layers (`mtp.{i}.*`) are declared skipped (`mtp_checkpoint_keys`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.dsv4_attention import DeepseekV4Attention, Fp32RMSNorm, make_ropes
from rapid_llm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.hyper_connection import HyperConnection, HyperHead
from rapid_llm.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.moe import FusedExperts, Router, RouterConfig
from rapid_llm.layers.moe.router import HashRouter
from rapid_llm.layers.rotary_embedding import RotaryEmbedding
from rapid_llm.models.llama import require_silu
from rapid_llm.models.weight_mapping import (
    SkippedKeys,
    StackedParam,
    expert_stacked_params,
    mtp_layer_keys,
)
from rapid_llm.ops.activation import clamped_silu_and_mul

MLP_TYPES = ("moe", "hash_moe")


class ClampedGatedMLP(nn.Module):
    """The shared expert: down(silu(min(gate, limit)) * clamp(up, -limit, limit)), checkpoint w1/w3/w2."""

    def __init__(self, hidden_size: int, intermediate_size: int, limit: float) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=False)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_silu_and_mul(self.gate_up_proj(x), self.limit))


class DeepseekV4MoE(nn.Module):
    """The checkpoint's `ffn`: gate (top-k router or hash router), routed experts and one shared expert."""

    def __init__(self, config: PretrainedConfig, layer_id: int) -> None:
        super().__init__()
        mlp_type = config.mlp_layer_types[layer_id]
        if mlp_type not in MLP_TYPES:
            raise ValueError(f"mlp_layer_types[{layer_id}] must be one of {MLP_TYPES}, got {mlp_type!r}")
        require_silu(config)
        router = RouterConfig.deepseek_v4(config)
        self.hashed = mlp_type == "hash_moe"
        self.gate = (HashRouter(config.hidden_size, config.vocab_size, router) if self.hashed
                     else Router(config.hidden_size, router))
        self.experts = FusedExperts(config.n_routed_experts, config.hidden_size, config.moe_intermediate_size,
                                    config.swiglu_limit)
        # transformers builds one shared expert of moe_intermediate_size whatever n_shared_experts says.
        self.shared_experts = ClampedGatedMLP(config.hidden_size, config.moe_intermediate_size, config.swiglu_limit)

    def forward(self, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        routing = self.gate(hidden_states, token_ids) if self.hashed else self.gate(hidden_states)
        return self.experts(hidden_states, *routing) + self.shared_experts(hidden_states)


class DeepseekV4DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_id: int, ropes: dict[str, RotaryEmbedding]) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.attn = DeepseekV4Attention(config, layer_id, ropes)
        self.ffn = DeepseekV4MoE(config, layer_id)
        self.attn_norm = Fp32RMSNorm(config.hidden_size, eps)
        self.ffn_norm = Fp32RMSNorm(config.hidden_size, eps)
        self.attn_hc = HyperConnection(config.hidden_size, config.hc_mult, config.hc_sinkhorn_iters, config.hc_eps, eps)
        self.ffn_hc = HyperConnection(config.hidden_size, config.hc_mult, config.hc_sinkhorn_iters, config.hc_eps, eps)

    def forward(self, streams: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        post, comb, x = self.attn_hc(streams)
        streams = HyperConnection.merge(streams, self.attn(self.attn_norm(x), batch), post, comb)
        post, comb, x = self.ffn_hc(streams)
        return HyperConnection.merge(streams, self.ffn(self.ffn_norm(x), batch.input_ids), post, comb)


class DeepseekV4Model(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.hc_mult = config.hc_mult
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        ropes = make_ropes(config)
        self.layers = nn.ModuleList(DeepseekV4DecoderLayer(config, i, ropes) for i in range(config.num_hidden_layers))
        self.hc_head = HyperHead(config.hidden_size, config.hc_mult, config.hc_eps, config.rms_norm_eps)
        self.norm = Fp32RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        embeddings = self.embed_tokens(batch.input_ids)
        streams = embeddings.unsqueeze(1).expand(-1, self.hc_mult, -1).contiguous()
        for layer in self.layers:
            streams = layer(streams, batch)
        return self.norm(self.hc_head(streams))


def _stacked_params(num_experts: int) -> tuple[StackedParam, ...]:
    renames = [("lm_head", "head"), ("gate.e_score_correction_bias", "gate.bias"),
               ("shared_experts.down_proj", "shared_experts.w2")]
    renames += [(f"{block}_hc.{part}", f"hc_{block}_{part}") for block in ("attn", "ffn")
                for part in ("fn", "base", "scale")]
    return (expert_stacked_params(num_experts, projections=("w1", "w3", "w2"))
            + (StackedParam("shared_experts.gate_up_proj", "shared_experts.w1", 0),
               StackedParam("shared_experts.gate_up_proj", "shared_experts.w3", 1))
            + tuple(StackedParam(param, checkpoint, None) for param, checkpoint in renames))


def mtp_checkpoint_keys(config: PretrainedConfig) -> tuple[SkippedKeys, ...]:
    """The `num_nextn_predict_layers` MTP layers, stored apart from the decoder as `mtp.{i}.*` (a decoder layer
    plus enorm, hnorm, e_proj, h_proj, norm, head and hc_head_*), with or without a `model.` prefix (transformers
    ignores `mtp.` names under any prefix)."""
    return mtp_layer_keys(config, "mtp.{i}.* for i < num_nextn_predict_layers", r"(?:model\.)?mtp\.",
                          "not built for V4")


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        if getattr(config, "num_key_value_heads", 1) != 1:
            raise ValueError("DeepSeek-V4 attention has one shared K=V head: num_key_value_heads must be 1")
        self.config = config
        self.stacked_params = _stacked_params(config.n_routed_experts)
        self.skipped_checkpoint_keys = mtp_checkpoint_keys(config)
        self.model = DeepseekV4Model(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model(batch)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)
