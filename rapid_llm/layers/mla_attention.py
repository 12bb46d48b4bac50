"""The MLA attention layer: caches one latent per token and delegates to the bound `mla_attention` backend.

The model computes the query (nope part, then rotated rope part) and the latent (kv_a_layernorm of the
compressed KV, then the rotated rope key); this layer declares the latent cache (`MLALatentSpec`) and
passes both, with the weight of the model's `kv_b_proj` (which turns latents into per-head keys and
values, in checkpoint layout), to the backend the worker bound.
Usage: `MLAAttention(num_heads, dims, scale)(query [T, H * qk_head_dim], latent [T, latent_dim], kv_b_weight,
metadata) -> [T, H * v_head_dim]`.
"""

from __future__ import annotations

import torch

from rapid_llm.layers.attention import PagedAttentionLayer
from rapid_llm.ops.attention import AttentionMetadata, MLADims
from rapid_llm.ops.attention.kv_cache_spec import MLALatentSpec


class MLAAttention(PagedAttentionLayer):
    attention_op = "mla_attention"

    def __init__(self, num_heads: int, dims: MLADims, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dims = dims
        self.scale = scale

    def kv_cache_spec(self, dtype: torch.dtype) -> MLALatentSpec:
        return MLALatentSpec(dtype, self.dims.kv_lora_rank, self.dims.qk_rope_head_dim)

    def forward(self, query: torch.Tensor, latent: torch.Tensor, kv_b_weight: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        kv_cache, backend = self.bound()
        output = backend.forward(query.view(-1, self.num_heads, self.dims.qk_head_dim), latent, kv_cache, kv_b_weight,
                                 self.dims, metadata, self.scale)
        return output.reshape(-1, self.num_heads * self.dims.v_head_dim)
