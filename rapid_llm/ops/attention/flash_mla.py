"""FlashMLA (`flash_mla`, optional) as an mla_attention backend on Hopper: a thin adapter for the decodes.

FlashMLA's dense decode kernel is weight-absorbed MLA as our Triton backend runs it: multi-query attention
over the latent cache seen as [blocks, 64, 1, 576] keys whose first 512 values are the value. So this
backend is the Triton one (absorption, chunks of several queries through the Triton kernel, up-projection)
with the one-token sequences sent to `flash_mla_with_kvcache` instead. Its schedule (`get_mla_metadata`,
called with the pre-2025-09 arguments, which newer releases ignore) depends on the heads, which only a
layer knows, so a step's first layer makes it and the others reuse it. FlashMLA needs page_block_size 64,
kv_lora_rank 512 and qk_rope_head_dim 64 (DeepSeek-V2/V3), bf16/fp16: metadata refuses another block size
(`--block-size 64`), forward other widths. Untested on a GPU: the tests drive it with a stand-in module.
Usage: `--op-backend mla_attention=flash_mla`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import torch

try:
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata
except ImportError as error:  # optional: the registry selects this module only where flash_mla is found
    raise ImportError(f"this adapter needs the optional library flash_mla (FlashMLA): {error}") from error

from rapid_llm.ops.attention.backend import StepLayout
from rapid_llm.ops.attention.mla_triton import TritonMLABackend, TritonMLAMetadata

PAGE_BLOCK_SIZE = 64
KV_LORA_RANK, ROPE_DIM = 512, 64  # head_dim_v 512 and head_dim 576 are all its dense decode compiles


@dataclass
class FlashMLAMetadata(TritonMLAMetadata):
    decode_tokens: torch.Tensor | None = None  # [D] int64, the token row of each one-token sequence
    decode_seq_lens: torch.Tensor | None = None  # [D] int32
    decode_block_tables: torch.Tensor | None = None  # [D, max_blocks] int32
    planned: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # num_heads -> this step's schedule


class FlashMLABackend(TritonMLABackend):
    def build_metadata(self, layout: StepLayout, device: torch.device) -> FlashMLAMetadata:
        if layout.block_size != PAGE_BLOCK_SIZE:
            raise ValueError(f"mla_attention backend flash_mla needs KV block size {PAGE_BLOCK_SIZE} "
                             f"(FlashMLA's page_block_size; --block-size {PAGE_BLOCK_SIZE}), got {layout.block_size}")
        decodes = [seq for seq, query_len in enumerate(layout.query_lens) if query_len == 1]
        chunks = [seq for seq, query_len in enumerate(layout.query_lens) if query_len > 1]
        starts = [0, *accumulate(layout.query_lens)]
        width = max((len(layout.block_tables[seq]) for seq in decodes), default=0) or 1
        rows = [list(layout.block_tables[seq]) + [0] * (width - len(layout.block_tables[seq])) for seq in decodes]
        return FlashMLAMetadata(
            **vars(self.metadata_for(layout, device, chunks)),
            decode_tokens=torch.tensor([starts[seq] for seq in decodes], dtype=torch.int64, device=device),
            decode_seq_lens=torch.tensor([layout.seq_lens[seq] for seq in decodes], dtype=torch.int32, device=device),
            decode_block_tables=torch.tensor(rows, dtype=torch.int32, device=device).view(len(decodes), width),
        )

    def attend(self, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_cache: torch.Tensor, attended: torch.Tensor,
               metadata: FlashMLAMetadata, scale: float) -> None:
        if (q_latent.shape[-1], q_rope.shape[-1]) != (KV_LORA_RANK, ROPE_DIM):
            raise ValueError(f"mla_attention backend flash_mla needs kv_lora_rank {KV_LORA_RANK} and "
                             f"qk_rope_head_dim {ROPE_DIM}, got {q_latent.shape[-1]} and {q_rope.shape[-1]}")
        super().attend(q_latent, q_rope, kv_cache, attended, metadata, scale)
        if not metadata.decode_tokens.numel():
            return
        num_heads = q_latent.shape[1]
        tokens = metadata.decode_tokens
        if num_heads not in metadata.planned:
            # One KV head: num_q_tokens_per_head_k = seq_len_q (1) * num_heads_q / num_heads_k (1).
            metadata.planned[num_heads] = get_mla_metadata(metadata.decode_seq_lens, num_heads, 1)
        schedule, splits = metadata.planned[num_heads]
        query = torch.cat((q_latent[tokens], q_rope[tokens]), dim=-1).to(kv_cache.dtype).unsqueeze(1)
        out, _ = flash_mla_with_kvcache(query, kv_cache.unsqueeze(2), metadata.decode_block_tables,
                                        metadata.decode_seq_lens, KV_LORA_RANK, schedule, splits,
                                        softmax_scale=scale, causal=False)
        attended[tokens] = out[:, 0].to(attended.dtype)


FLASH_MLA_BACKEND = FlashMLABackend()  # stateless: schedules live in the step's metadata
