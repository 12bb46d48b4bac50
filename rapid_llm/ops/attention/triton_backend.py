"""Triton attention backend: paged attention of a mixed batch without gathering any history.

The step's sequences are split once per step (in `build_metadata`, from the host-side layout) into
decodes (one query token) and prefills (several: a fresh prompt or a chunk after cached tokens).
Prefills run the flash-attention kernel (`ops/triton/attention_prefill.py`), decodes the split-KV
kernel (`ops/triton/attention_decode.py`); both read K/V straight from the paged cache through the
block table, write disjoint rows of one output, and handle GQA and sliding windows.
CUDA graphs: a decode-only step reads only device tensors plus the split count and length, which
`graph_decode_metadata` fixes for the longest sequence a graph may see (empty splits past a short
sequence's end cost a program each and write lse = -inf, so the merge is exact for any length).
Usage: selected as the "attention" op on CUDA (`REGISTRY.select("attention", device, dtype).fn`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from rapid_llm import ops
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.triton.attention_common import kernel_window
from rapid_llm.ops.triton.attention_decode import decode_attention
from rapid_llm.ops.triton.attention_prefill import prefill_attention
from rapid_llm.utils.host_staging import to_device


@dataclass
class TritonAttentionMetadata(AttentionMetadata):
    decode_seq_ids: torch.Tensor  # [num_decodes] int64, sequences computing one token
    prefill_seq_ids: torch.Tensor  # [num_prefills] int64, sequences computing several
    max_prefill_query_len: int
    num_kv_splits: int  # decode keys are cut into this many splits of kv_split_len positions
    kv_split_len: int


class TritonAttentionBackend(AttentionBackend):
    """`min_split_len` keys at least per decode split, and at most `max_splits` splits: short contexts
    stay in one program per (sequence, KV head), long ones spread over up to `max_splits` programs."""

    supports_cuda_graphs = True

    def __init__(self, min_split_len: int = 256, max_splits: int = 32) -> None:
        if min_split_len < 1 or max_splits < 1:
            raise ValueError(f"min_split_len ({min_split_len}) and max_splits ({max_splits}) must be at least 1")
        self.min_split_len = min_split_len
        self.max_splits = max_splits

    def build_metadata(self, layout: StepLayout, device: torch.device) -> TritonAttentionMetadata:
        common = build_common_metadata(layout, device)
        decodes = [seq for seq, query_len in enumerate(layout.query_lens) if query_len == 1]
        prefills = [seq for seq, query_len in enumerate(layout.query_lens) if query_len > 1]
        max_decode_len = max((layout.seq_lens[seq] for seq in decodes), default=1)
        num_splits, split_len = self._splits(max_decode_len)
        decode_ids, prefill_ids = to_device([torch.tensor(decodes, dtype=torch.int64),
                                             torch.tensor(prefills, dtype=torch.int64)], device)
        return TritonAttentionMetadata(
            **vars(common),
            decode_seq_ids=decode_ids,
            prefill_seq_ids=prefill_ids,
            max_prefill_query_len=max((layout.query_lens[seq] for seq in prefills), default=0),
            num_kv_splits=num_splits,
            kv_split_len=split_len,
        )

    def graph_decode_metadata(self, common: AttentionMetadata, max_seq_len: int) -> TritonAttentionMetadata:
        num_splits, split_len = self._splits(max_seq_len)
        num_seqs = common.seq_lens.shape[0]
        return TritonAttentionMetadata(
            **vars(common),
            decode_seq_ids=torch.arange(num_seqs, dtype=torch.int64, device=common.seq_lens.device),
            prefill_seq_ids=torch.empty(0, dtype=torch.int64, device=common.seq_lens.device),
            max_prefill_query_len=0,
            num_kv_splits=num_splits,
            kv_split_len=split_len,
        )

    def _splits(self, max_decode_len: int) -> tuple[int, int]:
        """(number of splits, keys per split) for decodes of at most `max_decode_len` keys."""
        split_len = max(self.min_split_len, triton.cdiv(max_decode_len, self.max_splits))
        return triton.cdiv(max_decode_len, split_len), split_len

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: TritonAttentionMetadata,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        num_heads, num_kv_heads = query.shape[1], kv_cache.shape[3]
        if num_heads % num_kv_heads or not kv_cache.is_contiguous():
            raise ValueError(f"triton attention: {num_heads} query heads must be a multiple of the cache's "
                             f"{num_kv_heads} KV heads, and the cache contiguous")
        if query.stride(-1) != 1:
            query = query.contiguous()
        window = kernel_window(sliding_window)
        ops.kv_cache_store(key, value, kv_cache, metadata.slot_mapping)
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        common = (metadata.query_start_loc, metadata.seq_lens, metadata.block_tables)
        if metadata.prefill_seq_ids.numel():
            prefill_attention(query, kv_cache, output, metadata.prefill_seq_ids, *common,
                              metadata.max_prefill_query_len, scale, window)
        if metadata.decode_seq_ids.numel():
            decode_attention(query, kv_cache, output, metadata.decode_seq_ids, *common, metadata.num_kv_splits,
                             metadata.kv_split_len, scale, window)
        return output


TRITON_BACKEND = TritonAttentionBackend()  # stateless per step: one instance serves every layer
