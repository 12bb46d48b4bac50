"""The MLA (multi-head latent attention) backend interface: the `mla_attention` op's implementations.

DeepSeek-V2/V3 cache one latent per token instead of per-head K/V: the compressed KV after
kv_a_layernorm (`kv_lora_rank` wide) followed by the rotated rope key (`qk_rope_head_dim`, shared by
all heads), in a paged tensor [blocks, block_size, kv_lora_rank + qk_rope_head_dim] (`MLALatentSpec`).
Keys and values of a head come from the latent through `kv_b_proj`, so a backend gets its weight in
checkpoint layout ([H * (qk_nope + v), kv_lora_rank]: per head, nope-key rows then value rows): the
reference expands the history with it, a weight-absorbed kernel folds it into the query and output.
Metadata is the same per-step structure as the `attention` op's, built once per step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
import torch

from rapid_llm.ops.attention.backend import AttentionMetadata, StepLayout


@dataclass(frozen=True)
class MLADims:
    """Per-head widths of one MLA layer."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class MLABackend(ABC):
    """Causal MLA over a paged latent cache for one mixed prefill/extend/decode batch."""

    @abstractmethod
    def build_metadata(self, layout: StepLayout, device: torch.device) -> AttentionMetadata:
        """Turn the host-side layout into device tensors, once per step."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        latent: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_b_weight: torch.Tensor,
        dims: MLADims,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """query [T, H, qk_nope + qk_rope] (rope part rotated), latent [T, kv_lora_rank + qk_rope] (this step's
        tokens), kv_cache [blocks, block_size, latent_dim], kv_b_weight [H * (qk_nope + v), kv_lora_rank]
        -> output [T, H, v_head_dim].

        Writes the step's latents into the cache before attending, as the `attention` op does with K/V, so
        tokens see themselves and prefix-cache blocks written in the same step are readable.
        """


def write_latent_cache(latent: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter the step's latents into their cache slots."""
    kv_cache.view(-1, kv_cache.shape[-1]).index_copy_(0, slot_mapping, latent.to(kv_cache.dtype))


def absorption_weights(kv_b_weight: torch.Tensor, dims: MLADims, num_heads: int,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's per-head nope-key rows W_UK [H, qk_nope, kv_lora_rank] and value rows W_UV [H, v, kv_lora_rank],
    in `dtype`: what a weight-absorbed backend folds into the query and the output."""
    per_head = kv_b_weight.to(dtype).view(num_heads, dims.qk_nope_head_dim + dims.v_head_dim, dims.kv_lora_rank)
    key_rows, value_rows = per_head.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=1)
    return key_rows, value_rows
