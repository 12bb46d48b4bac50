"""Decode context parallelism's attention: each rank keeps 1/N of every sequence's KV and the ranks merge exactly.

The N ranks of a DCP group hold the same KV head (replicas under tensor parallelism) and different query heads.
A block of B tokens (the scheduler's) is stored as N shares of B/N: position p lives on rank p mod N, at offset
(p mod B) // N of block p // B, so the block tables are the scheduler's on every rank, a rank's local index of
position p is p // N, and the group's KV memory holds N times the tokens one rank could. A step: every rank writes
the new tokens of its residue class; the group all-gathers the queries (every head of the group); each rank
attends all of them over its own tokens (the key at local index j has position j N + rank, and the causal mask
compares positions, so prefill chunks and decodes are one path) and keeps the log-sum-exp of each row's scores;
the group all-gathers outputs and log-sum-exps and merges them: out = sum_r exp(lse_r - logsumexp_r lse_r) out_r,
exact up to float rounding. Each rank keeps its own heads.
Key design choice: torch ops in float32, a backend of its own that the worker selects only when N > 1, so the
single-rank backends stay as they are; sliding windows and quantized caches are refused at start.
Usage: `DecodeContextParallelBackend()` reads the DCP group from distributed/parallel_state.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from rapid_llm.distributed.collective_timer import timed
from rapid_llm.distributed.parallel_state import get_dcp_group, get_dcp_rank, get_dcp_size
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata


@dataclass
class DCPMetadata(AttentionMetadata):
    write_tokens: torch.Tensor | None = None  # [W] the step's tokens this rank stores
    write_slots: torch.Tensor | None = None  # [W] their slots in this rank's cache
    padded_index: torch.Tensor | None = None  # [T] each token's row in the [seqs * max_query_len] layout
    key_mask: torch.Tensor | None = None  # [seqs, 1, max_query_len, local keys]: key visible to query row
    max_query_len: int = 1
    local_keys: int = 1  # local indices covering the longest sequence's tokens on this rank


def _gather(tensor: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """[N, *tensor.shape]: every group rank's tensor, in rank order."""
    parts = torch.empty((size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    with timed(tensor.device):
        dist.all_gather_into_tensor(parts, tensor.contiguous(), group=group)
    return parts.view(size, *tensor.shape)


class DecodeContextParallelBackend(AttentionBackend):
    def __init__(self) -> None:
        self.rank, self.size, self.group = get_dcp_rank(), get_dcp_size(), get_dcp_group()

    def build_metadata(self, layout: StepLayout, device: torch.device) -> DCPMetadata:
        common = build_common_metadata(layout, device)
        size, block_size = self.size, layout.block_size
        positions, seq_index = common.positions, common.seq_index
        write_tokens = torch.nonzero(positions % size == self.rank).squeeze(1)
        owned = positions[write_tokens]
        write_slots = (common.block_tables[seq_index[write_tokens], owned // block_size] * (block_size // size)
                       + owned % block_size // size)
        query_lens = common.query_start_loc[1:] - common.query_start_loc[:-1]
        context_lens = common.seq_lens - query_lens
        max_query_len, max_seq_len = max(layout.query_lens), max(layout.seq_lens)
        padded_index = seq_index * max_query_len + positions - context_lens[seq_index]
        local_keys = max(1, -(-max_seq_len // size))
        query_positions = context_lens.unsqueeze(1) + torch.arange(max_query_len, device=device)
        key_positions = torch.arange(local_keys, device=device) * size + self.rank
        key_mask = ((key_positions < common.seq_lens.unsqueeze(1)).unsqueeze(1)
                    & (key_positions <= query_positions.unsqueeze(-1))).unsqueeze(1)
        return DCPMetadata(**vars(common), write_tokens=write_tokens, write_slots=write_slots,
                           padded_index=padded_index, key_mask=key_mask, max_query_len=max_query_len,
                           local_keys=local_keys)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: DCPMetadata, scale: float, sliding_window: int | None) -> torch.Tensor:
        """query [T, Hq, D] (this rank's heads), key/value [T, 1, D] (the group's KV head) -> [T, Hq, D]."""
        num_tokens, local_heads, head_dim = query.shape
        pages = kv_cache.flatten(1, 2)  # [2, slots, Hkv, D]
        pages[0].index_copy_(0, metadata.write_slots, key[metadata.write_tokens].to(kv_cache.dtype))
        pages[1].index_copy_(0, metadata.write_slots, value[metadata.write_tokens].to(kv_cache.dtype))
        queries = _gather(query, self.group, self.size).permute(1, 0, 2, 3).flatten(1, 2)  # [T, N * Hq, D]
        num_seqs, heads = metadata.seq_lens.shape[0], queries.shape[1]
        padded = queries.new_zeros(num_seqs * metadata.max_query_len, heads, head_dim, dtype=torch.float32)
        padded[metadata.padded_index] = queries.float()
        padded = padded.view(num_seqs, metadata.max_query_len, heads, head_dim).transpose(1, 2)
        # [2, seqs, blocks * local block, 1, D] -> the first local_keys local indices, one KV head.
        history = kv_cache[:, metadata.block_tables].flatten(2, 3)[:, :, : metadata.local_keys, 0].float()
        scores = torch.einsum("bhqd,bkd->bhqk", padded, history[0]) * scale
        scores = scores.masked_fill(~metadata.key_mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # -inf for a row without local keys
        weights = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1))
        attended = torch.einsum("bhqk,bkd->bhqd", weights, history[1])
        # Back to token rows: [T, heads, D] and [T, heads].
        out = attended.transpose(1, 2).reshape(-1, heads, head_dim)[metadata.padded_index]
        lse = lse.transpose(1, 2).reshape(-1, heads)[metadata.padded_index]
        outs, lses = _gather(out, self.group, self.size), _gather(lse, self.group, self.size)
        total = torch.logsumexp(lses, dim=0)  # every query sees at least itself on some rank
        merged = (torch.exp(lses - total).unsqueeze(-1) * outs).sum(dim=0)
        mine = merged[:, self.rank * local_heads : (self.rank + 1) * local_heads]
        return mine.to(query.dtype).view(num_tokens, local_heads, head_dim)
