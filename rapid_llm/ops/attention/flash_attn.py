"""FlashAttention-2 (`flash_attn`, optional) as an attention backend on CUDA: a thin adapter.

One `flash_attn_varlen_func` call per layer over the whole mixed batch, reading K/V from the paged cache
through `block_table` (the cache's [blocks, block_size, kv_heads, head_dim] halves are FlashAttention's
paged layout); causal masking is aligned to the end of each sequence, as a chunk after cached context
needs. FlashAttention-2 requires the page size to be a multiple of 256 (`--block-size 256`); metadata
refuses other sizes. Untested: no machine this was written on had a GPU or the library; only its
selection is tested (with a stand-in module). Registered below torch_ref until a GPU check verifies it.
Usage: `--attention-backend flash_attn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

try:
    from flash_attn import flash_attn_varlen_func
except ImportError as error:  # optional: the registry selects this module only where flash_attn is found
    raise ImportError(f"this adapter needs the optional library flash_attn (flash-attn): {error}") from error

from rapid_llm import ops
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata

PAGE_MULTIPLE = 256


@dataclass
class FlashAttnMetadata(AttentionMetadata):
    cu_seqlens_q: torch.Tensor | None = None  # [S + 1] int32
    cu_seqlens_k: torch.Tensor | None = None  # [S + 1] int32
    block_table_int32: torch.Tensor | None = None  # [S, max_blocks] int32
    max_query_len: int = 0
    max_seq_len: int = 0


class FlashAttnBackend(AttentionBackend):
    def build_metadata(self, layout: StepLayout, device: torch.device) -> FlashAttnMetadata:
        if layout.block_size % PAGE_MULTIPLE:
            raise ValueError(f"attention backend flash_attn needs a KV block size that is a multiple of "
                             f"{PAGE_MULTIPLE} (FlashAttention-2's paged KV), got {layout.block_size}")
        common = build_common_metadata(layout, device)
        return FlashAttnMetadata(
            **vars(common),
            cu_seqlens_q=torch.tensor([0, *accumulate(layout.query_lens)], dtype=torch.int32, device=device),
            cu_seqlens_k=torch.tensor([0, *accumulate(layout.seq_lens)], dtype=torch.int32, device=device),
            block_table_int32=common.block_tables.to(torch.int32),
            max_query_len=max(layout.query_lens),
            max_seq_len=max(layout.seq_lens),
        )

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: FlashAttnMetadata, scale: float, sliding_window: int | None) -> torch.Tensor:
        ops.kv_cache_store(key, value, kv_cache, metadata.slot_mapping)
        # Our window counts the query itself (q - k < window); FlashAttention's left window does not.
        window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        return flash_attn_varlen_func(
            query, kv_cache[0], kv_cache[1], metadata.cu_seqlens_q, metadata.cu_seqlens_k, metadata.max_query_len,
            metadata.max_seq_len, softmax_scale=scale, causal=True, window_size=window,
            block_table=metadata.block_table_int32,
        )


FLASH_ATTN_BACKEND = FlashAttnBackend()
