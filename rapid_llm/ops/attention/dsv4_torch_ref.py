"""Pure-torch reference DeepSeek-V4 attention over the paged per-token rows (`DeepseekV4Spec`); CPU and CUDA.

A step (1) writes every token's shared K=V and raw compressor inputs into its row, (2) pools each window a
token of the step closes (its last token, position p with (p + 1) % rate == 0) from the rows of that window
and, for overlapping CSA compressors, the window before, gathered through the block table, and writes the
entry into the closing token's row, (3) attends per padded group (the torch_ref attention backend's
decode/prefill groups): keys are the sliding window of K=V rows plus the compressed entries of windows
closed at or before the query (CSA: only the indexer's top-k of them), with each head's sink logit in the
softmax. Queries see entry w once (w + 1) * rate <= position + 1, as transformers' masks allow.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rapid_llm.ops.attention.backend import StepLayout
from rapid_llm.ops.attention.dsv4_backend import CompressorInputs, DeepseekV4Backend, IndexerQuery
from rapid_llm.ops.attention.kv_cache_spec import DeepseekV4Spec
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND, PaddedGroup, TorchAttentionMetadata


def _write_rows(flat: torch.Tensor, slots: torch.Tensor, start: int, values: torch.Tensor) -> None:
    flat[slots, start:start + values.shape[-1]] = values.to(flat.dtype)


def _pool_closed_windows(flat: torch.Tensor, block_size: int, spec: DeepseekV4Spec, index: int,
                         compressor: CompressorInputs, metadata: TorchAttentionMetadata) -> None:
    """Compute and store the entry of every window that a token of this step closes."""
    positions = metadata.positions
    closing = torch.nonzero((positions + 1) % spec.rate == 0).squeeze(1)
    if closing.numel() == 0:
        return
    entry_col, kv_col, gate_col = spec.compressor_offsets(index)
    raw_width = compressor.kv.shape[-1]
    window_end = positions[closing] + 1
    offsets = torch.arange(spec.series, device=flat.device) - spec.series  # windows ending `series` back .. 0
    window_starts = window_end.unsqueeze(1) + offsets * spec.rate  # [N, series]
    valid = window_starts >= 0
    token_positions = (window_starts.unsqueeze(-1) + torch.arange(spec.rate, device=flat.device)).clamp(min=0)
    tables = metadata.block_tables[metadata.seq_index[closing]]  # [N, max_blocks]
    blocks = torch.gather(tables, 1, (token_positions // block_size).flatten(1)).view_as(token_positions)
    rows = flat[blocks * block_size + token_positions % block_size]  # [N, series, rate, row]
    kv = rows[..., kv_col:kv_col + raw_width].to(compressor.kv.dtype)
    gate = rows[..., gate_col:gate_col + raw_width].to(compressor.gate.dtype)
    entries = compressor.pool(kv, gate, valid, window_end - spec.rate)
    _write_rows(flat, metadata.slot_mapping[closing], entry_col, entries)


def _indexer_selection(indexer: IndexerQuery, history: torch.Tensor, group: PaddedGroup, column: int,
                       visible: torch.Tensor) -> torch.Tensor:
    """[Bg, max_q, C] True for the entries among each query's visible ones the indexer keeps (its top-k)."""
    keys = history[..., column:column + indexer.query.shape[-1]].float()  # [Bg, C, I]
    query = group.pad_queries(indexer.query).float()  # [Bg, heads, max_q, I]
    weights = group.pad_queries(indexer.weights.unsqueeze(-1)).float()  # [Bg, heads, max_q, 1]
    scores = torch.relu(query @ keys.unsqueeze(1).transpose(-1, -2)) * indexer.scale
    scores = (scores * weights).sum(dim=1).masked_fill(~visible, float("-inf"))  # [Bg, max_q, C]
    top = scores.topk(min(indexer.top_k, scores.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(visible).scatter_(-1, top, True)
    return chosen & visible


def _attend_group(query: torch.Tensor, indexer: IndexerQuery | None, sinks: torch.Tensor, kv_cache: torch.Tensor,
                  spec: DeepseekV4Spec, group: PaddedGroup, scale: float, sliding_window: int) -> torch.Tensor:
    """One padded group's attention [Bg, H, max_q, D] over its sliding window and compressed entries."""
    # float32 throughout (transformers' softmax is float32 too: its float32 sinks promote the logits).
    history = kv_cache[group.block_tables].flatten(1, 2)[:, : group.max_kv_len].float()
    padded = group.pad_queries(query).float()  # [Bg, H, max_q, D]
    window = history[..., : spec.head_dim]  # [Bg, L, D], keys and values
    logits = [(padded @ window.unsqueeze(1).transpose(-1, -2) * scale)
              .masked_fill(~group.mask(sliding_window), float("-inf"))]
    values = [window]
    if spec.compressor_widths:
        entry_rows = history[:, spec.rate - 1::spec.rate]  # [Bg, C, row]: rows of windows' last tokens
        entries = entry_rows[..., spec.head_dim:2 * spec.head_dim]
        closed = torch.arange(entries.shape[1], device=query.device) + 1
        visible = closed * spec.rate <= group.query_positions.unsqueeze(-1) + 1  # [Bg, max_q, C]
        if indexer is not None and entries.shape[1] > 0:
            visible = _indexer_selection(indexer, entry_rows, group, spec.compressor_offsets(1)[0], visible)
        logits.append((padded @ entries.unsqueeze(1).transpose(-1, -2) * scale)
                      .masked_fill(~visible.unsqueeze(1), float("-inf")))
        values.append(entries)
    sink = sinks.float().view(1, -1, 1, 1).expand(*padded.shape[:3], 1)
    combined = torch.cat([*logits, sink], dim=-1)
    probs = (combined - combined.max(dim=-1, keepdim=True).values).softmax(dim=-1)[..., :-1]
    return probs @ torch.cat(values, dim=1).unsqueeze(1)


class TorchDeepseekV4Backend(DeepseekV4Backend):
    def build_metadata(self, layout: StepLayout, device: torch.device) -> TorchAttentionMetadata:
        return TORCH_REF_BACKEND.build_metadata(layout, device)

    def forward(
        self,
        query: torch.Tensor,
        kv: torch.Tensor,
        compressors: Sequence[CompressorInputs],
        indexer: IndexerQuery | None,
        sinks: torch.Tensor,
        kv_cache: torch.Tensor,
        spec: DeepseekV4Spec,
        metadata: TorchAttentionMetadata,
        scale: float,
        sliding_window: int,
    ) -> torch.Tensor:
        if len(compressors) != len(spec.compressor_widths) or (indexer is not None) != (len(compressors) == 2):
            raise ValueError("a DeepSeek-V4 layer passes one CompressorInputs per compressor of its cache spec, "
                             "and indexer queries exactly when it has the indexer's compressor")
        block_size = kv_cache.shape[1]
        flat = kv_cache.view(-1, kv_cache.shape[-1])
        _write_rows(flat, metadata.slot_mapping, 0, kv)
        for index, compressor in enumerate(compressors):
            _, kv_col, gate_col = spec.compressor_offsets(index)
            _write_rows(flat, metadata.slot_mapping, kv_col, compressor.kv)
            _write_rows(flat, metadata.slot_mapping, gate_col, compressor.gate)
        for index, compressor in enumerate(compressors):
            _pool_closed_windows(flat, block_size, spec, index, compressor, metadata)
        output = torch.empty_like(query)
        for group in metadata.groups:
            attended = _attend_group(query, indexer, sinks, kv_cache, spec, group, scale, sliding_window)
            group.write_output(output, attended)
        return output


DSV4_TORCH_REF_BACKEND = TorchDeepseekV4Backend()  # stateless: one instance serves every layer and step
