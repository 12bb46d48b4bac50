"""The `triton` MLA backend: weight-absorbed attention of a whole mixed batch in one kernel launch per layer.

As `torch_absorbed` does for decodes (same rounding points: kv_b_proj, the absorbed query and the latent
output in the compute dtype), kv_b_proj's nope-key rows fold into the query (torch einsum), the kernel
(`ops/triton/mla_attention.py`) attends over the cached latents through the block table, and the value rows
lift its latent-space output to v_head_dim (torch einsum). Unlike torch_absorbed, prefills and chunks after
cached context are absorbed too (no expansion of the history), so decodes and chunks share one launch.
Usage: selected as the "mla_attention" op on CUDA (`REGISTRY.select("mla_attention", device, dtype).fn`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from rapid_llm.ops.attention.backend import AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.attention.mla_backend import MLABackend, MLADims, absorption_weights, write_latent_cache
from rapid_llm.ops.cpu_half import compute_dtype
from rapid_llm.ops.triton.mla_attention import mla_attention


@dataclass
class TritonMLAMetadata(AttentionMetadata):
    kernel_seq_ids: torch.Tensor  # [S'] int64, the sequences the Triton kernel computes
    max_kernel_query_len: int  # the longest query among them (sizes the grid)


class TritonMLABackend(MLABackend):
    def build_metadata(self, layout: StepLayout, device: torch.device) -> TritonMLAMetadata:
        return self.metadata_for(layout, device, range(len(layout.query_lens)))

    @staticmethod
    def metadata_for(layout: StepLayout, device: torch.device, kernel_seqs: Sequence[int]) -> TritonMLAMetadata:
        """Metadata whose kernel launch covers `kernel_seqs` (host lists, copied like the common fields)."""
        seq_ids = torch.tensor(list(kernel_seqs), dtype=torch.int64)
        return TritonMLAMetadata(
            **vars(build_common_metadata(layout, device)),
            kernel_seq_ids=seq_ids if device.type == "cpu" else seq_ids.to(device, non_blocking=True),
            max_kernel_query_len=max((layout.query_lens[seq] for seq in kernel_seqs), default=0),
        )

    def forward(self, query: torch.Tensor, latent: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor,
                dims: MLADims, metadata: TritonMLAMetadata, scale: float) -> torch.Tensor:
        if kv_cache.shape[-1] != dims.latent_dim:
            raise ValueError(f"triton mla_attention: the latent cache must hold {dims.latent_dim} values per token, "
                             f"got shape {tuple(kv_cache.shape)}")
        if query.stride(-1) != 1:
            query = query.contiguous()
        write_latent_cache(latent, kv_cache, metadata.slot_mapping)
        compute = compute_dtype(query.device, query.dtype)
        key_rows, value_rows = absorption_weights(kv_b_weight, dims, query.shape[1], compute)
        query_nope, query_rope = query.to(compute).split([dims.qk_nope_head_dim, dims.qk_rope_head_dim], dim=-1)
        # [T, H, nope] x [H, nope, L] -> [T, H, L]: the query in latent space.
        q_latent = torch.einsum("thn,hnl->thl", query_nope, key_rows)
        attended = q_latent.new_empty(q_latent.shape)  # contiguous, whatever layout einsum chose
        self.attend(q_latent, query_rope, kv_cache, attended, metadata, scale)
        return torch.einsum("thl,hvl->thv", attended, value_rows).to(query.dtype)

    def attend(self, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, attended: torch.Tensor,
               metadata: TritonMLAMetadata, scale: float) -> None:
        """Latent-space attention of the step's tokens into `attended` [T, H, kv_lora_rank]."""
        if metadata.kernel_seq_ids.numel():
            mla_attention(q_latent, q_rope, kv_cache, attended, metadata.kernel_seq_ids, metadata.query_start_loc,
                          metadata.seq_lens, metadata.block_tables, metadata.max_kernel_query_len, scale)


TRITON_MLA_BACKEND = TritonMLABackend()  # stateless: one instance serves every layer and step
