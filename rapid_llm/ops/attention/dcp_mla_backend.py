"""Decode context parallelism for MLA (DeepSeek-V2/V3): each rank keeps 1/N of every sequence's latents.

MLA caches one latent per token, shared by every head and replicated on every tensor-parallel rank, so any
block of N tensor-parallel ranks can split the tokens (dcp_backend.py's layout: position p on rank p mod N).
Attention runs weight-absorbed, as mla_absorbed.py's decode: each rank folds kv_b_proj's nope-key rows into its
heads' queries ([T, H, kv_lora_rank + rope]), which makes MLA multi-query attention over the latent itself
(keys: the whole latent, values: its kv_lora_rank part); `DCPShares` gathers those queries, attends this rank's
share, merges the shares by log-sum-exp, and each rank maps its heads' merged latent outputs through the value
rows. Prefill chunks are absorbed too (no expansion of the history), in float32.
Usage: `DecodeContextParallelMLABackend()`, selected by the worker for `mla_attention` when N > 1.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.attention.dcp_backend import DCPGroup, DCPMetadata, DCPShares
from rapid_llm.ops.attention.mla_backend import MLABackend, MLADims, absorption_weights


class DecodeContextParallelMLABackend(DCPShares, MLABackend):
    def forward(self, query: torch.Tensor, latent: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor,
                dims: MLADims, metadata: DCPMetadata, scale: float) -> torch.Tensor:
        """query [T, H, qk_nope + qk_rope] (this rank's heads), latent [T, latent_dim] -> [T, H, v_head_dim]."""
        slots = kv_cache.flatten(0, 1)  # [blocks * rank block, latent_dim]
        slots.index_copy_(0, metadata.write_slots, latent[metadata.write_tokens].to(kv_cache.dtype))
        key_rows, value_rows = absorption_weights(kv_b_weight, dims, query.shape[1], torch.float32)
        query_nope, query_rope = query.float().split([dims.qk_nope_head_dim, dims.qk_rope_head_dim], dim=-1)
        absorbed = torch.cat((torch.einsum("thn,hnl->thl", query_nope, key_rows), query_rope), dim=-1)

        def history(group: DCPGroup) -> tuple[torch.Tensor, torch.Tensor]:
            # Values are the latent's kv_lora_rank part: attend the whole latent (keys and values as wide, as a fused
            # kernel needs) and keep that part of the output.
            shares = kv_cache[metadata.block_tables[group.seq_ids]].flatten(1, 2)[:, : group.local_keys]
            return shares, shares

        attended = self.attend_shares(absorbed, metadata, scale, dims.latent_dim, history)[..., : dims.kv_lora_rank]
        return torch.einsum("thl,hvl->thv", attended, value_rows).to(query.dtype)
