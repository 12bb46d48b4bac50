"""Decode context parallelism's attention: each rank keeps 1/N of every sequence's KV and the ranks merge exactly.

The N ranks of a DCP group hold the same KV head (replicas under tensor parallelism) and different query heads.
A block of B tokens (the scheduler's) is stored as N shares of B/N: position p lives on rank p mod N, at offset
(p mod B) // N of block p // B, so the block tables are the scheduler's on every rank, a rank's local index of
position p is p // N, and the group's KV memory holds N times the tokens one rank could. A step: every rank writes
the new tokens of its residue class; the group all-gathers the queries (every head of the group); each rank
attends all of them over its own tokens through the registry's `attention_lse` (the key at local index j has
position j N + rank; the causal mask compares positions, decodes and prefill chunks padded as two groups);
the group all-gathers outputs and log-sum-exps and merges them: out = sum_r exp(lse_r - logsumexp_r lse_r) out_r,
exact up to float rounding. Each rank keeps its own heads. `DCPShares` is what this backend and MLA's
(dcp_mla_backend.py) share; they differ in the cache they read.
Key design choice: float32, a backend of its own that the worker selects only when N > 1, so the single-rank
backends stay as they are; sliding windows and quantized caches are refused at start.
Usage: `DecodeContextParallelBackend()` reads the DCP group from distributed/parallel_state.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from rapid_llm import ops
from rapid_llm.distributed.collective_timer import timed
from rapid_llm.distributed.parallel_state import get_dcp_group, get_dcp_rank, get_dcp_size
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata


@dataclass
class DCPGroup:
    """Sequences attended together, padded to their longest query (decodes and prefill chunks apart, so a long
    chunk does not pad every decode to its length)."""

    seq_ids: torch.Tensor  # [S] the group's sequences
    token_index: torch.Tensor  # [Tg] the group's tokens in the step
    padded_index: torch.Tensor  # [Tg] each token's row in the [S * max_query_len] layout
    key_mask: torch.Tensor  # [S, 1, max_query_len, local_keys]: key visible to query row
    max_query_len: int
    local_keys: int  # local indices covering the group's longest sequence on this rank


@dataclass
class DCPMetadata(AttentionMetadata):
    write_tokens: torch.Tensor | None = None  # [W] the step's tokens this rank stores
    write_slots: torch.Tensor | None = None  # [W] their slots in this rank's cache
    groups: list[DCPGroup] = field(default_factory=list)


def _gather(tensor: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """[N, *tensor.shape]: every group rank's tensor, in rank order."""
    parts = torch.empty((size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    with timed(tensor.device):
        dist.all_gather_into_tensor(parts, tensor.contiguous(), group=group)
    return parts.view(size, *tensor.shape)


class DCPShares:
    """What both DCP backends share: the step's metadata (who writes which token where, the padded groups), the
    partial attention over this rank's share through the registry's `attention_lse`, and the exact merge."""

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
        decodes = torch.tensor([length == 1 for length in layout.query_lens], dtype=torch.bool, device=device)
        groups = [self._group(common, query_lens, seq_ids, device)
                  for seq_ids in (torch.nonzero(decodes).squeeze(1), torch.nonzero(~decodes).squeeze(1))
                  if len(seq_ids)]
        return DCPMetadata(**vars(common), write_tokens=write_tokens, write_slots=write_slots, groups=groups)

    def _group(self, common: AttentionMetadata, query_lens: torch.Tensor, seq_ids: torch.Tensor,
               device: torch.device) -> DCPGroup:
        seq_lens, size = common.seq_lens[seq_ids], self.size
        max_query_len, max_seq_len = int(query_lens[seq_ids].max()), int(seq_lens.max())
        local_id = torch.full_like(query_lens, -1)
        local_id[seq_ids] = torch.arange(len(seq_ids), device=device)
        token_index = torch.nonzero(local_id[common.seq_index] >= 0).squeeze(1)
        context_lens = common.seq_lens - query_lens
        token_seq = common.seq_index[token_index]
        padded_index = local_id[token_seq] * max_query_len + common.positions[token_index] - context_lens[token_seq]
        local_keys = -(-max_seq_len // size)
        query_positions = context_lens[seq_ids].unsqueeze(1) + torch.arange(max_query_len, device=device)
        key_positions = torch.arange(local_keys, device=device) * size + self.rank
        key_mask = ((key_positions < seq_lens.unsqueeze(1)).unsqueeze(1)
                    & (key_positions <= query_positions.unsqueeze(-1))).unsqueeze(1)
        return DCPGroup(seq_ids, token_index, padded_index, key_mask, max_query_len, local_keys)

    def attend_shares(self, query: torch.Tensor, metadata: DCPMetadata, scale: float, value_dim: int,
                      history: Callable[[DCPGroup], tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """query [T, Hq, D] (this rank's heads) over every rank's share of the keys -> [T, Hq, value_dim] in
        float32. `history(group)`: the group's keys [S, local_keys, D] and values [S, local_keys, value_dim] here."""
        num_tokens, local_heads = query.shape[0], query.shape[1]
        queries = _gather(query, self.group, self.size).permute(1, 0, 2, 3).flatten(1, 2)  # [T, N * Hq, D]
        heads = queries.shape[1]
        out = queries.new_empty(num_tokens, heads, value_dim, dtype=torch.float32)
        lse = queries.new_empty(num_tokens, heads, dtype=torch.float32)
        for group in metadata.groups:
            keys, values = history(group)
            num_seqs = len(group.seq_ids)
            padded = queries.new_zeros(num_seqs * group.max_query_len, heads, queries.shape[2], dtype=torch.float32)
            padded[group.padded_index] = queries[group.token_index].float()
            padded = padded.view(num_seqs, group.max_query_len, heads, -1).transpose(1, 2)
            group_out, group_lse = ops.attention_lse(padded, keys, values, group.key_mask, scale)
            out[group.token_index] = group_out.transpose(1, 2).reshape(-1, heads, value_dim)[group.padded_index]
            lse[group.token_index] = group_lse.transpose(1, 2).reshape(-1, heads)[group.padded_index]
        outs, lses = _gather(out, self.group, self.size), _gather(lse, self.group, self.size)
        total = torch.logsumexp(lses, dim=0)  # every query sees at least itself on some rank
        merged = (torch.exp(lses - total).unsqueeze(-1) * outs).sum(dim=0)
        return merged[:, self.rank * local_heads : (self.rank + 1) * local_heads]


class DecodeContextParallelBackend(DCPShares, AttentionBackend):
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: DCPMetadata, scale: float, sliding_window: int | None) -> torch.Tensor:
        """query [T, Hq, D] (this rank's heads), key/value [T, 1, D] (the group's KV head) -> [T, Hq, D]."""
        pages = kv_cache.flatten(1, 2)  # [2, slots, Hkv, D]
        pages[0].index_copy_(0, metadata.write_slots, key[metadata.write_tokens].to(kv_cache.dtype))
        pages[1].index_copy_(0, metadata.write_slots, value[metadata.write_tokens].to(kv_cache.dtype))

        def history(group: DCPGroup) -> tuple[torch.Tensor, torch.Tensor]:
            # [2, seqs, blocks * rank block, 1, D] -> the first local_keys local indices of the one KV head.
            shares = kv_cache[:, metadata.block_tables[group.seq_ids]].flatten(2, 3)[:, :, : group.local_keys, 0]
            return shares[0], shares[1]

        return self.attend_shares(query, metadata, scale, value.shape[-1], history).to(query.dtype)
