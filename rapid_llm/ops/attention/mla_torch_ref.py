"""Pure-torch reference MLA over the paged latent cache, in the expanded form; runs on CPU and CUDA.

The step's latents are written into the cache first; then, per padded group (decodes, prefills: the
torch_ref attention backend's metadata and padding), each sequence's latent history is gathered through
its block table and expanded by `kv_b_proj` into per-head nope-keys and values, the shared rope key is
appended to every head's key, and `scaled_dot_product_attention` runs with the causal mask. Expanding
costs a GEMM over the whole history per layer and step; it is the oracle a weight-absorbed kernel
(queries folded into the latent space, attention over the latent itself) must match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rapid_llm import ops
from rapid_llm.ops.attention.backend import StepLayout
from rapid_llm.ops.attention.mla_backend import MLABackend, MLADims, write_latent_cache
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND, PaddedGroup, TorchAttentionMetadata
from rapid_llm.ops.cpu_half import compute_dtype


def latent_history(kv_cache: torch.Tensor, group: PaddedGroup) -> torch.Tensor:
    """The group's latents [Bg, keys, latent_dim], gathered through its block tables ([Bg, blocks, block_size, ..])."""
    return kv_cache[group.block_tables].flatten(1, 2)[:, : group.max_kv_len]


def _expanded_history(kv_cache: torch.Tensor, group: PaddedGroup, kv_b_weight: torch.Tensor, dims: MLADims,
                      num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys [Bg, H, keys, qk_head_dim] and values [Bg, H, keys, v_head_dim] of the group's histories."""
    latent = latent_history(kv_cache, group).to(kv_b_weight.dtype)  # the model dtype kv_b_proj computes in
    compressed, rope_key = latent.split([dims.kv_lora_rank, dims.qk_rope_head_dim], dim=-1)
    num_seqs, num_keys = latent.shape[0], latent.shape[1]
    expanded = ops.linear(compressed.reshape(num_seqs * num_keys, dims.kv_lora_rank), kv_b_weight)
    expanded = expanded.view(num_seqs, num_keys, num_heads, dims.qk_nope_head_dim + dims.v_head_dim)
    nope_key, value = expanded.split([dims.qk_nope_head_dim, dims.v_head_dim], dim=-1)
    rope_key = rope_key.unsqueeze(2).expand(num_seqs, num_keys, num_heads, dims.qk_rope_head_dim)
    key = torch.cat((nope_key, rope_key), dim=-1)
    return key.transpose(1, 2), value.transpose(1, 2)


class TorchMLABackend(MLABackend):
    def build_metadata(self, layout: StepLayout, device: torch.device) -> TorchAttentionMetadata:
        return TORCH_REF_BACKEND.build_metadata(layout, device)

    def forward(
        self,
        query: torch.Tensor,
        latent: torch.Tensor,
        kv_cache: torch.Tensor,
        kv_b_weight: torch.Tensor,
        dims: MLADims,
        metadata: TorchAttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        write_latent_cache(latent, kv_cache, metadata.slot_mapping)
        output = query.new_empty(query.shape[0], query.shape[1], dims.v_head_dim)
        for group in metadata.groups:
            group.write_output(output, self.attend_group(query, kv_cache, kv_b_weight, dims, group, scale))
        return output

    def attend_group(self, query: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor, dims: MLADims,
                     group: PaddedGroup, scale: float) -> torch.Tensor:
        """One padded group's attention [Bg, H, max_q, v_head_dim] (latents already in the cache), expanded."""
        key, value = _expanded_history(kv_cache, group, kv_b_weight, dims, query.shape[1])
        # fp32 where the CPU has no half kernels (as the attention reference); otherwise the model dtype.
        compute = compute_dtype(query.device, query.dtype)
        return F.scaled_dot_product_attention(group.pad_queries(query).to(compute), key.to(compute),
                                              value.to(compute), attn_mask=group.mask(None), scale=scale)


MLA_TORCH_REF_BACKEND = TorchMLABackend()  # stateless: one instance serves every layer and step
