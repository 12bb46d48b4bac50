"""Pure-torch reference attention over the paged KV cache; runs on CPU and CUDA.

The batch is split into two groups — decodes (one query token) and prefills (several) — and
each group is padded to a dense [seqs, heads, queries, keys] problem for
`scaled_dot_product_attention`. Padding the groups separately keeps a long prefill from
inflating every decode row to its length. A group of fresh prompts (no cached context) without a sliding
window passes `is_causal` instead of the bool mask, so the CPU flash kernel skips the blocks above the
diagonal (a 1500-token prefill step of llama-10m: 1.4-1.75x); on the CPU, long chunks after cached context
are split at the context boundary instead (`context_split.py`). Gathering a sequence's keys through its block table
row is one indexing op, so there is no Python loop over tokens or sequences in the forward.
An fp8 or nvfp4 cache (`--kv-cache-dtype fp8 | nvfp4`) is quantized on write and its gathered history
dequantized here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rapid_llm import ops
from rapid_llm.ops.cpu_half import compute_dtype
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.attention.context_split import attend_split_at_context, splits_at_context
from rapid_llm.ops.attention.kv_quant import (
    UNIT_KV_SCALES, KVScales, dequantize_kv, dequantize_kv_nvfp4, is_fp8_kv, is_nvfp4_kv, write_kv_cache_fp8,
    write_kv_cache_nvfp4,
)


@dataclass
class PaddedGroup:
    """Sequences of one group laid out densely: local sequence g holds query rows g*max_q..."""

    token_index: torch.Tensor  # [Tg] positions of the group's tokens in the flat batch
    padded_index: torch.Tensor  # [Tg] row of each token in the [Bg * max_q] padded layout
    query_positions: torch.Tensor  # [Bg, max_q] absolute position of every padded query row
    block_tables: torch.Tensor  # [Bg, blocks covering max_kv]
    context_lens: torch.Tensor  # [Bg] cached tokens of each sequence
    query_lens: torch.Tensor  # [Bg] new tokens of each sequence
    num_seqs: int
    max_query_len: int
    max_kv_len: int
    fresh: bool = False  # no sequence has cached context: queries and keys share positions 0..max_q-1
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """Causal (optionally sliding-window) mask, built once per step per window size."""
        if sliding_window not in self.masks:
            key_positions = torch.arange(self.max_kv_len, device=self.query_positions.device)
            query_positions = self.query_positions.unsqueeze(-1)
            allowed = key_positions <= query_positions
            if sliding_window is not None:
                allowed &= query_positions - key_positions < sliding_window
            self.masks[sliding_window] = allowed.unsqueeze(1)
        return self.masks[sliding_window]

    def causal_only(self, sliding_window: int | None) -> bool:
        """Whether `is_causal=True` gives the mask's result for every real query row.

        Holds for a fresh group without a window: a real row's allowed keys are its own sequence's positions
        up to itself, and padding rows (query or key) sit after every real position, so only padding rows
        see padding keys. The CPU flash kernel then skips the blocks above the diagonal instead of computing
        the whole rectangle and converting a bool mask in every call.
        """
        return self.fresh and sliding_window is None

    def pad_queries(self, query: torch.Tensor) -> torch.Tensor:
        """The group's rows of the flat query [T, heads, D] as [Bg, heads, max_q, D]."""
        if self.max_query_len == 1:
            # Decodes: one query per sequence, already in padded order, so no scatter is needed.
            return query[self.token_index].unsqueeze(2)
        num_heads, head_dim = query.shape[1], query.shape[2]
        padded = query.new_zeros(self.num_seqs * self.max_query_len, num_heads, head_dim)
        padded[self.padded_index] = query[self.token_index]
        return padded.view(self.num_seqs, self.max_query_len, num_heads, head_dim).transpose(1, 2)

    def write_output(self, output: torch.Tensor, attended: torch.Tensor) -> None:
        """Put the padded result [Bg, heads, max_q, D] into the group's rows of the flat output [T, heads, D]."""
        if self.max_query_len == 1:
            output[self.token_index] = attended.squeeze(2).to(output.dtype)
            return
        flat = attended.transpose(1, 2).reshape(-1, attended.shape[1], attended.shape[3])
        output[self.token_index] = flat[self.padded_index].to(output.dtype)


@dataclass
class TorchAttentionMetadata(AttentionMetadata):
    groups: list[PaddedGroup] = field(default_factory=list)


def build_padded_group(common: AttentionMetadata, seq_ids: torch.Tensor, block_size: int) -> PaddedGroup:
    query_lens = common.query_start_loc[1:] - common.query_start_loc[:-1]
    group_query_lens = query_lens[seq_ids]
    group_seq_lens = common.seq_lens[seq_ids]
    max_query_len = int(group_query_lens.max())
    max_kv_len = int(group_seq_lens.max())

    local_id = torch.full_like(query_lens, -1)
    local_id[seq_ids] = torch.arange(len(seq_ids), device=seq_ids.device)
    token_local_id = local_id[common.seq_index]
    token_index = torch.nonzero(token_local_id >= 0).squeeze(1)
    context_lens = common.seq_lens - query_lens
    offset_in_query = common.positions[token_index] - context_lens[common.seq_index[token_index]]
    padded_index = token_local_id[token_index] * max_query_len + offset_in_query

    query_offsets = torch.arange(max_query_len, device=seq_ids.device)
    query_positions = context_lens[seq_ids].unsqueeze(1) + query_offsets
    num_blocks = -(-max_kv_len // block_size)
    return PaddedGroup(
        token_index=token_index,
        padded_index=padded_index,
        query_positions=query_positions,
        block_tables=common.block_tables[seq_ids, :num_blocks],
        context_lens=context_lens[seq_ids],
        query_lens=group_query_lens,
        num_seqs=len(seq_ids),
        max_query_len=max_query_len,
        max_kv_len=max_kv_len,
        fresh=bool((context_lens[seq_ids] == 0).all()),
    )


def attend_padded_group(output: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor, group: PaddedGroup,
                        scale: float, sliding_window: int | None, kv_scales: KVScales | None = None) -> None:
    """Attention of one padded group's tokens (K/V already in the cache), written into their output rows."""
    # [2, Bg, blocks, block_size, Hkv, D] -> [2, Bg, Hkv, keys, D]
    history = kv_cache[:, group.block_tables].flatten(2, 3)[:, :, : group.max_kv_len].transpose(2, 3)
    if is_fp8_kv(history.dtype):
        # Dequantized into the query's compute dtype (an fp8 cache stands in for the model dtype).
        scales = kv_scales or UNIT_KV_SCALES
        compute = compute_dtype(history.device, query.dtype)
        keys, values = dequantize_kv(history[0], scales.k_scale, compute), dequantize_kv(history[1], scales.v_scale,
                                                                                          compute)
    elif is_nvfp4_kv(history.dtype):
        compute = compute_dtype(history.device, query.dtype)
        keys, values = (dequantize_kv_nvfp4(history[index], query.shape[-1], compute) for index in (0, 1))
    else:
        # fp32 where the CPU has no half kernels (3x faster there); otherwise the cache dtype.
        compute = compute_dtype(history.device, history.dtype)
        keys, values = history[0].to(compute), history[1].to(compute)
    queries = group.pad_queries(query).to(compute)
    causal = group.causal_only(sliding_window)
    if not causal and splits_at_context(queries.device, group.max_query_len, sliding_window):
        lens = list(zip(group.context_lens.tolist(), group.query_lens.tolist()))
        attended = attend_split_at_context(queries, keys, values, lens, scale)
    else:
        attended = F.scaled_dot_product_attention(
            queries,
            keys,
            values,
            attn_mask=None if causal else group.mask(sliding_window),
            is_causal=causal,
            scale=scale,
            enable_gqa=query.shape[1] != kv_cache.shape[3],
        )
    group.write_output(output, attended)


class TorchReferenceBackend(AttentionBackend):
    supports_fp8_kv = True
    supports_nvfp4_kv = True

    def build_metadata(self, layout: StepLayout, device: torch.device) -> TorchAttentionMetadata:
        common = build_common_metadata(layout, device)
        is_decode = torch.tensor([q == 1 for q in layout.query_lens], dtype=torch.bool, device=device)
        groups = [
            build_padded_group(common, seq_ids, layout.block_size)
            for seq_ids in (torch.nonzero(is_decode).squeeze(1), torch.nonzero(~is_decode).squeeze(1))
            if len(seq_ids) > 0
        ]
        return TorchAttentionMetadata(**vars(common), groups=groups)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: TorchAttentionMetadata,
        scale: float,
        sliding_window: int | None,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        if is_fp8_kv(kv_cache.dtype):
            write_kv_cache_fp8(key, value, kv_cache, metadata.slot_mapping, kv_scales or UNIT_KV_SCALES)
        elif is_nvfp4_kv(kv_cache.dtype):
            write_kv_cache_nvfp4(key, value, kv_cache, metadata.slot_mapping)
        else:
            ops.kv_cache_store(key, value, kv_cache, metadata.slot_mapping)
        output = torch.empty_like(query)
        for group in metadata.groups:
            attend_padded_group(output, query, kv_cache, group, scale, sliding_window, kv_scales)
        return output


TORCH_REF_BACKEND = TorchReferenceBackend()  # stateless: one instance serves every layer and step
