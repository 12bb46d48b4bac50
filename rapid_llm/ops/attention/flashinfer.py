"""FlashInfer (`flashinfer`, optional) as an attention backend on CUDA: a thin adapter.

`BatchPrefillWithPagedKVCacheWrapper` (NHD layout, which is how each half of our cache is laid out)
covers prefills, chunks after context and decodes in one call. Its `plan` needs the head counts, scale
and window, which only a layer's forward knows, so the first layer of a step with a given combination
plans it and the others reuse it; each combination keeps its own wrapper and workspace (a plan lives in
its workspace). Page tables are built on the host from the step's lists. Untested: no machine this was
written on had a GPU or the library; only its selection is tested (with a stand-in module). Registered
below torch_ref until a GPU check verifies it.
Usage: `--attention-backend flashinfer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import torch

try:
    import flashinfer
except ImportError as error:  # optional: the registry selects this module only where flashinfer is found
    raise ImportError(f"this adapter needs the optional library flashinfer (flashinfer-python): {error}") from error

from rapid_llm import ops
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata

WORKSPACE_BYTES = 128 << 20  # FlashInfer's documented example size


@dataclass
class FlashInferMetadata(AttentionMetadata):
    qo_indptr: torch.Tensor | None = None  # [S + 1] int32
    kv_indptr: torch.Tensor | None = None  # [S + 1] int32, into kv_indices
    kv_indices: torch.Tensor | None = None  # the used blocks of every sequence, concatenated
    kv_last_page_len: torch.Tensor | None = None  # [S] tokens in each sequence's last block
    block_size: int = 0
    planned: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # plan key -> wrapper planned this step


class FlashInferBackend(AttentionBackend):
    def __init__(self) -> None:
        self._wrappers: dict[tuple[Any, ...], Any] = {}

    def build_metadata(self, layout: StepLayout, device: torch.device) -> FlashInferMetadata:
        size = layout.block_size
        pages = [-(-length // size) for length in layout.seq_lens]
        indices = [block for row, count in zip(layout.block_tables, pages) for block in row[:count]]
        return FlashInferMetadata(
            **vars(build_common_metadata(layout, device)),
            qo_indptr=torch.tensor([0, *accumulate(layout.query_lens)], dtype=torch.int32, device=device),
            kv_indptr=torch.tensor([0, *accumulate(pages)], dtype=torch.int32, device=device),
            kv_indices=torch.tensor(indices, dtype=torch.int32, device=device),
            kv_last_page_len=torch.tensor([(length - 1) % size + 1 for length in layout.seq_lens],
                                          dtype=torch.int32, device=device),
            block_size=size,
        )

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: FlashInferMetadata, scale: float, sliding_window: int | None) -> torch.Tensor:
        ops.kv_cache_store(key, value, kv_cache, metadata.slot_mapping)
        num_heads, head_dim, num_kv_heads = query.shape[1], query.shape[2], kv_cache.shape[3]
        plan_key = (num_heads, num_kv_heads, head_dim, scale, sliding_window, query.dtype, kv_cache.dtype)
        wrapper = metadata.planned.get(plan_key)
        if wrapper is None:
            if plan_key not in self._wrappers:
                workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=query.device)
                self._wrappers[plan_key] = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
            wrapper = self._wrappers[plan_key]
            # Our window counts the query itself (q - k < window); FlashInfer's window_left does not.
            wrapper.plan(metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices, metadata.kv_last_page_len,
                         num_heads, num_kv_heads, head_dim, metadata.block_size, causal=True, sm_scale=scale,
                         window_left=-1 if sliding_window is None else sliding_window - 1,
                         q_data_type=query.dtype, kv_data_type=kv_cache.dtype)
            metadata.planned[plan_key] = wrapper
        return wrapper.run(query, (kv_cache[0], kv_cache[1]))


FLASHINFER_BACKEND = FlashInferBackend()  # wrappers and workspaces are created on the first forward
