"""The `torch_absorbed` MLA backend: decodes attend over the latents themselves, prefills stay expanded.

Per head, q_nope . (W_UK c) = (W_UK^T q_nope) . c and sum p (W_UV c) = W_UV (sum p c), where W_UK / W_UV
are kv_b_proj's nope-key / value rows. Folding W_UK into the query and W_UV into the output turns MLA
into multi-query attention with a single KV head read straight from the cache (keys: the whole latent,
values: its kv_lora_rank part), so a decode never expands its history: per layer it costs
heads x keys x latent multiply-adds instead of the expansion's keys x heads x (nope + v) x kv_lora_rank.
Chunks of several queries keep the expanded form of torch_ref, where the expansion is shared by every
query of the chunk (vLLM and SGLang split the same way). Plain torch ops: CPU and CUDA; the numerics
matrix checks it against torch_ref.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rapid_llm.ops.attention.mla_backend import MLADims, absorption_weights
from rapid_llm.ops.attention.mla_torch_ref import TorchMLABackend, latent_history
from rapid_llm.ops.attention.torch_ref import PaddedGroup
from rapid_llm.ops.cpu_half import compute_dtype


class AbsorbedMLABackend(TorchMLABackend):
    def attend_group(self, query: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor, dims: MLADims,
                     group: PaddedGroup, scale: float) -> torch.Tensor:
        if group.max_query_len > 1:
            return super().attend_group(query, kv_cache, kv_b_weight, dims, group, scale)
        compute = compute_dtype(query.device, query.dtype)
        num_heads = query.shape[1]
        key_rows, value_rows = absorption_weights(kv_b_weight, dims, num_heads, compute)
        query_nope, query_rope = group.pad_queries(query).to(compute).split(
            [dims.qk_nope_head_dim, dims.qk_rope_head_dim], dim=-1)
        # [Bg, H, 1, nope] x [H, nope, L] -> [Bg, H, 1, L]: the query in latent space.
        absorbed_query = torch.cat((torch.einsum("bhqn,hnl->bhql", query_nope, key_rows), query_rope), dim=-1)
        # [Bg, 1, keys, latent]: one KV head shared by every query head.
        latent = latent_history(kv_cache, group).unsqueeze(1).to(compute)
        attended = F.scaled_dot_product_attention(absorbed_query, latent, latent[..., : dims.kv_lora_rank],
                                                  attn_mask=group.mask(None), scale=scale, enable_gqa=True)
        return torch.einsum("bhql,hvl->bhqv", attended, value_rows)


MLA_ABSORBED_BACKEND = AbsorbedMLABackend()  # stateless: one instance serves every layer and step
