"""NemotronH (Nemotron-H 8B/47B): a stack of one-mixer blocks, each norm -> mixer -> residual add, the mixer chosen
by `layers_block_type`: "linear_attention" is Mamba2 (layers/mamba2_mixer.py, a state-group layer),
"full_attention" attention without positional encoding (no rotary), "mlp" a non-gated relu^2 MLP.

The blocks do not fit the shared Llama block (two sublayers per layer), so this file has its own, with the shared
pieces (embedding, RMSNorm with its fused residual add, paged attention, parallel linears, LM head); the checkpoint's
names (`backbone.embeddings`, `backbone.layers.N.mixer`, `backbone.norm_f`) are the modules' own, but q/k/v stacked.
"moe" blocks (Nemotron-3 Nano: relu^2 experts without a gate projection, a latent projection) are refused at
load: the fused MoE kernels compute SwiGLU experts only.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.config.model_config import attention_head_dim, attention_kv_heads
from rapid_llm.layers.attention import Attention
from rapid_llm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from rapid_llm.layers.mamba2_mixer import Mamba2Mixer
from rapid_llm.models.weight_mapping import MTP_REASON, SkippedKeys, StackedParam

BLOCK_TYPES = ("linear_attention", "full_attention", "mlp")


class NemotronHAttention(nn.Module):
    """Grouped-query attention over the paged KV cache, without rotary embedding or biases (as transformers')."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        head_dim = attention_head_dim(config)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, config.num_attention_heads,
                                          attention_kv_heads(config))
        self.o_proj = RowParallelLinear(config.num_attention_heads * head_dim, config.hidden_size)
        heads, kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.split_sizes = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        self.attn = Attention(heads, kv_heads, head_dim, head_dim**-0.5)

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        query, key, value = self.qkv_proj(hidden_states).split(self.split_sizes, dim=-1)
        return self.o_proj(self.attn(query, key, value, batch.metadata_for(self.attn)))


class NemotronHMLP(nn.Module):
    """down(relu(up(x))^2): no gate projection."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        if config.mlp_hidden_act != "relu2":
            raise ValueError(f"NemotronH mlp_hidden_act {config.mlp_hidden_act!r} is not supported; it uses 'relu2'")
        self.up_proj = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        return self.down_proj(torch.relu(self.up_proj(hidden_states)).square())


def make_mixer(config: PretrainedConfig, block_type: str) -> nn.Module:
    if block_type == "linear_attention":
        return Mamba2Mixer(config)
    if block_type == "full_attention":
        return NemotronHAttention(config)
    if block_type == "mlp":
        return NemotronHMLP(config)
    if block_type == "moe":
        raise ValueError("NemotronH 'moe' blocks (Nemotron-3 Nano: relu^2 experts with no gate projection, a latent "
                         "projection) are not supported: rapid_llm's fused MoE kernels compute SwiGLU experts only; "
                         f"NemotronH checkpoints with only {', '.join(BLOCK_TYPES)} blocks (Nemotron-H) are served")
    raise ValueError(f"NemotronH block type {block_type!r} is unknown; supported: {', '.join(BLOCK_TYPES)}")


class NemotronHBlock(nn.Module):
    def __init__(self, config: PretrainedConfig, block_type: str) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.mixer = make_mixer(config, block_type)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add of the block before is fused into this block's norm (the stream stays in the model
        dtype, as transformers' with residual_in_fp32 unused)."""
        if residual is None:
            residual, hidden_states = hidden_states, self.norm(hidden_states)
        else:
            hidden_states, residual = self.norm(hidden_states, residual)
        return self.mixer(hidden_states, batch), residual


class NemotronHModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(config, block_type) for block_type in config.layers_block_type)
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        hidden_states, residual = self.embeddings(batch.input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(hidden_states, residual, batch)
        hidden_states, _ = self.norm_f(hidden_states, residual)
        return hidden_states


class NemotronHForCausalLM(nn.Module):
    stacked_params: tuple[StackedParam, ...] = (StackedParam("qkv_proj", "q_proj", "q"),
                                                StackedParam("qkv_proj", "k_proj", "k"),
                                                StackedParam("qkv_proj", "v_proj", "v"))

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = NemotronHModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight
        # transformers ignores the multi-token-prediction layers (`mtp.*`) too.
        self.skipped_checkpoint_keys = (SkippedKeys("mtp.*", r"mtp\..+", f"{MTP_REASON} (not built)"),) \
            if getattr(config, "num_nextn_predict_layers", 0) else ()

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.backbone(batch)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)
