"""Prefill context parallelism's attention: wrap any backend so a rank attends its pieces over the gathered KV.

Under PCP a rank computes only its pieces of the step (distributed/prefill_context.py); each piece is a chunk
of its sequence, so the wrapped backend attends it unchanged from the pieces' layout (`PiecesLayout.pieces`). What
the wrapper adds: before attending, the group all-gathers the step's new K/V (MLA: latents) and every rank writes
all of it through the step's slots, so each rank's cache holds every token, as decode and later chunks expect.
A step that runs whole on every rank (no split) passes straight through.
Key design choice: a wrapper, not a backend of its own: the single-rank kernels (torch_ref, cpu_paged, Triton,
MLA's) keep serving, and the metadata the model sees (positions, sequence index) is the pieces'.
Usage: `PrefillContextParallelBackend(inner)` / `PrefillContextParallelMLABackend(inner)`; per step build the
metadata from `split_layout(layout, split)`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from rapid_llm import ops
from rapid_llm.distributed.prefill_context import TokenSplit, gather_step_tokens
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.attention.mla_backend import MLABackend, MLADims, write_latent_cache


@dataclass
class PiecesLayout(StepLayout):
    """A split step: its own fields describe the whole step (whose slots every rank writes), `pieces` this rank's
    pieces as chunks."""

    pieces: StepLayout | None = None
    split: TokenSplit | None = None


def split_layout(layout: StepLayout, split: TokenSplit) -> PiecesLayout:
    """`layout` (the whole step) with this rank's pieces: one chunk each, reading its sequence's blocks."""
    if layout.block_table is not None:
        pieces = replace(layout, query_lens=split.piece_query_lens, seq_lens=split.piece_ends,
                         block_table=layout.block_table[split.piece_seqs])
    else:
        pieces = replace(layout, query_lens=split.piece_query_lens, seq_lens=split.piece_ends,
                         block_tables=[layout.block_tables[seq] for seq in split.piece_seq_list])
    return PiecesLayout(**{field.name: getattr(layout, field.name) for field in fields(StepLayout)}, pieces=pieces,
                        split=split)


@dataclass
class PCPMetadata(AttentionMetadata):
    """The wrapped backend's metadata (`inner`); the common fields are its own (the pieces' when split)."""

    inner: Any = None
    step_slots: torch.Tensor | None = None  # [T] every step token's slot (split steps only)
    split: TokenSplit | None = None


def _build(inner_backend: Any, layout: StepLayout, device: torch.device) -> PCPMetadata:
    split = layout.split if isinstance(layout, PiecesLayout) else None
    inner = inner_backend.build_metadata(layout.pieces if split is not None else layout, device)
    common = {field.name: getattr(inner, field.name) for field in fields(AttentionMetadata)}
    step_slots = build_common_metadata(layout, device).slot_mapping if split is not None else None
    return PCPMetadata(**common, inner=inner, step_slots=step_slots, split=split)


class PrefillContextParallelBackend(AttentionBackend):
    def __init__(self, inner: AttentionBackend) -> None:
        self.inner = inner

    def build_metadata(self, layout: StepLayout, device: torch.device) -> PCPMetadata:
        return _build(self.inner, layout, device)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: PCPMetadata, scale: float, sliding_window: int | None) -> torch.Tensor:
        if metadata.split is not None:
            step_kv = gather_step_tokens(torch.stack((key, value), dim=1), metadata.split)  # [T, 2, Hkv, D]
            ops.kv_cache_store(step_kv[:, 0], step_kv[:, 1], kv_cache, metadata.step_slots)
        return self.inner.forward(query, key, value, kv_cache, metadata.inner, scale, sliding_window)


class PrefillContextParallelMLABackend(MLABackend):
    def __init__(self, inner: MLABackend) -> None:
        self.inner = inner

    def build_metadata(self, layout: StepLayout, device: torch.device) -> PCPMetadata:
        return _build(self.inner, layout, device)

    def forward(self, query: torch.Tensor, latent: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor,
                dims: MLADims, metadata: PCPMetadata, scale: float) -> torch.Tensor:
        if metadata.split is not None:
            write_latent_cache(gather_step_tokens(latent, metadata.split), kv_cache, metadata.step_slots)
        return self.inner.forward(query, latent, kv_cache, kv_b_weight, dims, metadata.inner, scale)
