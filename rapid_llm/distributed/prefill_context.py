"""Prefill context parallelism: the ranks of a PCP group (whole-model replicas) split every step's tokens.

Each sequence's new tokens are cut into 2N near-equal pieces and rank r computes pieces r and 2N - 1 - r (zig-zag:
an early piece attends few keys, a late one many, so every rank gets about the same causal attention work); the
pair is rotated by the sequence's index, so single-token decodes spread over the ranks too. A rank runs the model
on its pieces only; each piece is a query span [start, end) of its sequence that attends keys [0, end), exactly a
chunked-prefill chunk, so the attention backends serve it unchanged (pcp_backend.pieces_layout). Attention layers
all-gather the step's new K/V (ops/attention/pcp_backend.py) and every rank writes all of it: the KV lands
gathered, each rank holding every token, and decode needs nothing more. After the last layer the hidden states
are all-gathered back into step order (`gather_step_tokens`), so logits and sampling are those of one rank.
A step in which some rank would get no token (fewer new tokens than ranks) runs whole on every rank.
Key design choice: all-gather, not a ring: every rank must store all the K/V anyway, so both move the same bytes;
benchmarks/bench_pcp_exchange.py measured gloo's ring faster, but the exchange is ~4 % of a step (docs/parallelism.md).
Usage: `split = split_step(query_lens, seq_lens, rank, size, device)`; `full = gather_step_tokens(local, split)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from rapid_llm.distributed.collective_timer import timed
from rapid_llm.distributed.parallel_state import get_pcp_group, get_pcp_size
from rapid_llm.utils.host_staging import to_device


@dataclass
class TokenSplit:
    """This rank's share of one step's tokens."""

    mine: torch.Tensor  # [Tm] the step's token indices this rank computes, piece by piece
    piece_seqs: torch.Tensor  # [P] the step sequence each of this rank's pieces belongs to (device)
    piece_seq_list: list[int]
    piece_query_lens: list[int]
    piece_ends: list[int]  # tokens of its sequence a piece attends: its last position + 1
    token_seq_lens: torch.Tensor  # [Tm] each token's sequence length after the step
    gather_rows: torch.Tensor  # [T] each step token's row in the ranks' all-gathered [N * width] rows
    width: int  # the most tokens any rank computes: every rank pads to it for the all-gathers


def split_step(query_lens: np.ndarray, seq_lens: np.ndarray, rank: int, size: int,
               device: torch.device) -> TokenSplit | None:
    """This rank's zig-zag share of a step of sequences computing `query_lens` new tokens and holding `seq_lens`
    after it; None when some rank would get no token."""
    starts = np.concatenate(([0], np.cumsum(query_lens)))
    owned: list[list[int]] = [[] for _ in range(size)]
    pieces: list[tuple[int, int, int]] = []  # this rank's (sequence, first token index, end token index)
    for seq, length in enumerate(query_lens.tolist()):
        bounds = [length * k // (2 * size) for k in range(2 * size + 1)]
        for k in range(2 * size):
            if bounds[k] == bounds[k + 1]:
                continue
            owner = (min(k, 2 * size - 1 - k) + seq) % size
            first, end = int(starts[seq]) + bounds[k], int(starts[seq]) + bounds[k + 1]
            owned[owner].extend(range(first, end))
            if owner == rank:
                pieces.append((seq, first, end))
    if any(not tokens for tokens in owned):
        return None
    width = max(len(tokens) for tokens in owned)
    gather_rows = np.empty(int(starts[-1]), dtype=np.int64)
    for owner, tokens in enumerate(owned):
        gather_rows[tokens] = owner * width + np.arange(len(tokens))
    piece_seqs = [seq for seq, _, _ in pieces]
    context = seq_lens - query_lens
    piece_ends = [int(context[seq]) + end - int(starts[seq]) for seq, _, end in pieces]
    mine = np.asarray(owned[rank], dtype=np.int64)
    token_seq_lens = np.repeat(seq_lens[piece_seqs], [end - first for _, first, end in pieces])
    on_device = to_device([torch.from_numpy(mine), torch.tensor(piece_seqs, dtype=torch.int64),
                           torch.from_numpy(token_seq_lens.astype(np.int64)), torch.from_numpy(gather_rows)], device)
    return TokenSplit(on_device[0], on_device[1], piece_seqs, [end - first for _, first, end in pieces], piece_ends,
                      on_device[2], on_device[3], width)


def gather_step_tokens(local: torch.Tensor, split: TokenSplit) -> torch.Tensor:
    """Every rank's rows of a per-token tensor ([Tm, ...], this rank's tokens in `split.mine` order) -> [T, ...] in
    step order, on every rank of the PCP group."""
    size = get_pcp_size()
    padded = local.new_zeros((split.width, *local.shape[1:]))
    padded[: local.shape[0]] = local
    gathered = local.new_empty((size * split.width, *local.shape[1:]))
    with timed(local.device):
        dist.all_gather_into_tensor(gathered, padded, group=get_pcp_group())
    return gathered[split.gather_rows]
