"""The attention backend interface and the per-step metadata every backend receives.

A step is one flat batch of tokens from many sequences: prefills (possibly a chunk that
continues after cached tokens) and decodes mixed together. K/V of the new tokens are written
into a paged cache through `slot_mapping`; attention reads a sequence's history through its
row of `block_tables`. Backends build their own metadata once per step (shared by all layers), from
host-known values only: nothing in it reads the device. A backend with `supports_cuda_graphs` also wraps
static decode buffers into its metadata (`graph_decode_metadata`), for `worker_proc/cuda_graphs.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

from rapid_llm.utils.host_staging import to_device


@dataclass
class StepLayout:
    """Host-side description of one step, from which a backend builds its metadata.

    Sequence b computes query_lens[b] new tokens and afterwards holds seq_lens[b] tokens in
    the cache; its tokens live in the blocks block_tables[b] (in order). The worker passes
    `block_table` instead: the rows of its persistent device block table, already gathered
    ([num_seqs, width] int64, padded with its padding block), so no list is copied per step.
    """

    query_lens: Sequence[int]
    seq_lens: Sequence[int]
    block_tables: Sequence[Sequence[int]] = ()
    block_size: int = 16
    block_table: torch.Tensor | None = None

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
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int64, padded (0, or the worker's padding block)


class AttentionBackend(ABC):
    """Computes causal attention over a paged KV cache for one mixed batch.

    A backend with `supports_fp8_kv` also takes an fp8 cache, and then a `kv_scales` keyword (`kv_quant.KVScales`):
    it quantizes on write and dequantizes inside attention. The others are never bound to one.
    A backend with `supports_cuda_graphs` reads only device tensors (and Python values fixed at capture) in a
    decode-only forward, so that forward can be captured once and replayed with new buffer contents.
    """

    supports_fp8_kv: bool = False
    supports_cuda_graphs: bool = False

    def graph_decode_metadata(self, common: AttentionMetadata, max_seq_len: int) -> AttentionMetadata:
        """This backend's metadata over static decode buffers `common` (one query token per sequence), valid for
        any sequence length up to `max_seq_len` without rebuilding: what a CUDA graph captures."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

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
    """Positions, slots and block tables of a step: computed on the host with tensor ops (no loop per token) and
    staged to `device` in one non-blocking copy, or, with the worker's device `block_table`, the slots gathered
    from it on the device. Nothing reads the device, so a CUDA step stays asynchronous."""
    seq_lens = torch.tensor(layout.seq_lens, dtype=torch.int64)
    num_seqs = len(layout.query_lens)
    if layout.num_tokens == num_seqs:
        # Decodes only (one token each): the general arithmetic below reduces to this.
        query_start_loc = torch.arange(num_seqs + 1)
        seq_index, positions = query_start_loc[:-1], seq_lens - 1
    else:
        query_lens = torch.tensor(layout.query_lens, dtype=torch.int64)
        query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int64)
        torch.cumsum(query_lens, 0, out=query_start_loc[1:])
        seq_index = torch.repeat_interleave(torch.arange(num_seqs), query_lens)
        offset_in_query = torch.arange(int(query_start_loc[-1])) - query_start_loc[seq_index]
        positions = (seq_lens - query_lens)[seq_index] + offset_in_query
    if layout.block_table is not None:
        positions, seq_index, seq_lens, query_start_loc = to_device([positions, seq_index, seq_lens, query_start_loc],
                                                                    device)
        return AttentionMetadata(positions, seq_index, slot_mapping(layout.block_table, seq_index, positions,
                                                                    layout.block_size),
                                 seq_lens, query_start_loc, layout.block_table)
    width = max((len(row) for row in layout.block_tables), default=0) or 1
    rows = [list(row) + [0] * (width - len(row)) for row in layout.block_tables]
    block_tables = torch.tensor(rows, dtype=torch.int64).view(len(rows), width)
    slots = slot_mapping(block_tables, seq_index, positions, layout.block_size)
    return AttentionMetadata(*to_device([positions, seq_index, slots, seq_lens, query_start_loc, block_tables], device))


def slot_mapping(block_tables: torch.Tensor, seq_index: torch.Tensor, positions: torch.Tensor,
                 block_size: int) -> torch.Tensor:
    """The cache slot of every token: its sequence's block holding the position, times the block size, plus the
    offset in the block."""
    return block_tables[seq_index, positions // block_size] * block_size + positions % block_size
