"""Splitting a step's sequences for the chunked forms of the state ops (gated_delta_rule, ssd_scan).

A chunked form pays for whole chunks of CHUNK_SIZE tokens, so it takes the sequences of at least one chunk and
the token-by-token form the rest (`split_by_length`); each part runs on its sequences' tokens re-packed, with a
metadata of its own (`select_sequences`, kept states re-indexed). `kept_positions` says, per chunk, which tokens'
states a chunked form must rebuild.
Usage: `split_by_length(metadata, output, chunked, by_token, lambda form, tokens, sub: form(x[tokens], ..., sub))`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable

import torch

from rapid_llm.ops.state_metadata import StateMetadata, kept_states

CHUNK_SIZE = 64
Form = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ChunkPadding:
    """A step's sequences laid out as [sequences, chunks, CHUNK_SIZE] tokens, every sequence padded with zeros to
    the longest one's whole chunks (a padding token that writes and decays nothing, in both chunked forms)."""

    num_chunks: int
    valid: torch.Tensor  # [sequences, padded tokens] bool: a real token
    gather: torch.Tensor  # [sequences, padded tokens] int64: its flat index (0 for padding)

    @classmethod
    def of(cls, metadata: StateMetadata) -> ChunkPadding:
        chunks = -(-metadata.max_query_len // CHUNK_SIZE)
        starts = metadata.query_start_loc[:-1]
        positions = torch.arange(chunks * CHUNK_SIZE, device=starts.device)
        valid = positions < (metadata.query_start_loc[1:] - starts)[:, None]
        return cls(chunks, valid, torch.where(valid, starts[:, None] + positions, 0))

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """[tokens, ...] -> [sequences, chunks, CHUNK_SIZE, ...], zeros where padded."""
        tail = values.shape[1:]
        padded = torch.where(self.valid.view(*self.valid.shape, *([1] * len(tail))), values[self.gather], 0)
        return padded.view(self.valid.shape[0], self.num_chunks, CHUNK_SIZE, *tail)

    def unpad(self, values: torch.Tensor) -> torch.Tensor:
        """[sequences, chunks, CHUNK_SIZE, ...] -> [tokens, ...] (the real tokens, in order)."""
        return values.flatten(1, 2)[self.valid]


def split_by_length(metadata: StateMetadata, output: torch.Tensor, chunked: Form, by_token: Form,
                    call: Callable[[Form, torch.Tensor, StateMetadata], torch.Tensor]) -> torch.Tensor:
    """`output` with each part's rows: `call(form, tokens, sub)` runs `chunked` on the sequences of at least one
    chunk, `by_token` on the others (`tokens`: the part's flat token indices; `sub`: its metadata)."""
    lengths = (metadata.query_start_loc[1:] - metadata.query_start_loc[:-1]).tolist()
    long = [i for i, length in enumerate(lengths) if length >= CHUNK_SIZE]
    short = [i for i, length in enumerate(lengths) if length < CHUNK_SIZE]
    for chosen, form in ((long, chunked), (short, by_token)):
        if chosen:
            tokens, sub = select_sequences(metadata, lengths, chosen)
            output[tokens] = call(form, tokens, sub)
    return output


def select_sequences(metadata: StateMetadata, lengths: list[int], chosen: list[int]
                      ) -> tuple[torch.Tensor, StateMetadata]:
    """The flat token indices of the `chosen` sequences and a metadata over just them (tokens re-packed, the kept
    states of their tokens re-indexed)."""
    device = metadata.query_start_loc.device
    starts = metadata.query_start_loc.tolist()
    tokens = torch.cat([torch.arange(starts[i], starts[i] + lengths[i], device=device) for i in chosen])
    chosen_lengths = [lengths[i] for i in chosen]
    new_starts = [sum(chosen_lengths[:n]) for n in range(len(chosen) + 1)]
    index = torch.tensor(chosen, device=device)
    kept = []
    if metadata.kept is not None:
        where = {seq: n for n, seq in enumerate(chosen)}
        kept = [(where[seq], token - starts[seq], target)
                for token, target in zip(metadata.kept.tokens.tolist(), metadata.kept.targets.tolist())
                for seq in [bisect.bisect_right(starts, token) - 1] if seq in where]
    return tokens, StateMetadata(
        slots=metadata.slots[index], token_slots=metadata.token_slots[tokens],
        query_start_loc=torch.tensor(new_starts, device=device), has_initial_state=metadata.has_initial_state[index],
        max_query_len=max(chosen_lengths), kept=kept_states(chosen_lengths, kept, device))


def kept_positions(metadata: StateMetadata) -> dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """chunk -> (sequence, offset in the chunk, target row) of the kept tokens in it."""
    if metadata.kept is None:
        return None
    tokens, targets = metadata.kept.tokens, metadata.kept.targets
    seqs = torch.searchsorted(metadata.query_start_loc, tokens, right=True) - 1
    offsets = tokens - metadata.query_start_loc[seqs]
    chunks = offsets // CHUNK_SIZE
    return {chunk: (seqs[chunks == chunk], offsets[chunks == chunk] % CHUNK_SIZE, targets[chunks == chunk])
            for chunk in chunks.unique().tolist()}
