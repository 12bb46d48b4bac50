"""The attention backend interface and the per-step metadata every backend receives.

A step is one flat batch of tokens from many sequences: prefills (possibly a chunk that
continues after cached tokens) and decodes mixed together. K/V of the new tokens are written
into a paged cache through `slot_mapping`; attention reads a sequence's history through its
row of `block_tables`. Backends build their own metadata once per step (shared by all layers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class StepLayout:
    """Host-side description of one step, from which a backend builds its metadata.

    Sequence b computes query_lens[b] new tokens and afterwards holds seq_lens[b] tokens in
    the cache; its tokens live in the blocks block_tables[b] (in order).
    """

    query_lens: Sequence[int]
    seq_lens: Sequence[int]
    block_tables: Sequence[Sequence[int]]
    block_size: int

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@dataclass
class AttentionMetadata:
    """Device tensors shared by every attention layer in one forward."""

    positions: torch.Tensor  # [num_tokens] int64, position of each token in its sequence
    seq_index: torch.Tensor  # [num_tokens] int64, which sequence each token belongs to
    slot_mapping: torch.Tensor  # [num_tokens] int64
    seq_lens: torch.Tensor  # [num_seqs] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded with 0


class AttentionBackend(ABC):
    """Computes causal attention over a paged KV cache for one mixed batch.

    A backend with `supports_fp8_kv` also takes an fp8 cache, and then a `kv_scales` keyword (`kv_quant.KVScales`):
    it quantizes on write and dequantizes inside attention. The others are never bound to one.
    """

    supports_fp8_kv: bool = False

    @abstractmethod
    def build_metadata(self, layout: StepLayout, device: torch.device) -> AttentionMetadata:
        """Turn the host-side layout into device tensors, once per step."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """query [T, Hq, D], key/value [T, Hkv, D], kv_cache [2, blocks, block_size, Hkv, D] -> [T, Hq, D].

        Writes this step's key/value (of every sequence) into the cache before attending, so a token
        sees itself and a sequence can read a prefix-cache block that another sequence of the same
        step writes (the scheduler shares blocks whose KV is only scheduled, relying on this).
        """


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows into their cache slots: the torch_ref `kv_cache_store` op, for this cache layout."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def build_common_metadata(layout: StepLayout, device: torch.device) -> AttentionMetadata:
    """Positions, slots and block tables of a step, computed on the host with tensor ops (no loop per token)
    and then copied to `device`: no device op and no device-to-host read (a CUDA step stays asynchronous)."""
    query_lens = torch.tensor(layout.query_lens, dtype=torch.int64)
    seq_lens = torch.tensor(layout.seq_lens, dtype=torch.int64)
    width = max((len(row) for row in layout.block_tables), default=0) or 1
    rows = [list(row) + [0] * (width - len(row)) for row in layout.block_tables]
    block_tables = torch.tensor(rows, dtype=torch.int64).view(len(rows), width)

    query_start_loc = torch.zeros(len(layout.query_lens) + 1, dtype=torch.int64)
    torch.cumsum(query_lens, 0, out=query_start_loc[1:])
    seq_index = torch.repeat_interleave(torch.arange(len(layout.query_lens)), query_lens)
    offset_in_query = torch.arange(int(query_start_loc[-1])) - query_start_loc[seq_index]
    positions = (seq_lens - query_lens)[seq_index] + offset_in_query
    block_ids = block_tables[seq_index, positions // layout.block_size]
    slot_mapping = block_ids * layout.block_size + positions % layout.block_size
    fields = (positions, seq_index, slot_mapping, seq_lens, query_start_loc, block_tables)
    if device.type != "cpu":
        fields = tuple(field.to(device, non_blocking=True) for field in fields)
    return AttentionMetadata(*fields)
