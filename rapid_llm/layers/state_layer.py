"""Layers that keep per-request recurrent state (Gated DeltaNet, Mamba) beside paged attention layers.

A `StateLayer` declares a `StateSpec`; the worker's state cache group allocates its tensors, each
[max_num_seqs + 1 + snapshots + scratch, *shape]: a row per input-batch slot (the scheduler's slot allocator
allocates them), a padding row, the snapshot rows, then the speculative scratch rows. Each step the group
builds one `StateMetadata` for all state layers, which a layer reads with `batch.metadata_for(self)`, and zeroes
the rows of sequences whose chunk starts at token 0 before the forward: a layer only reads and updates its
sequences' rows, so chunked prefill carries state from chunk to chunk and a preempted request starts afresh.
State is not per block: prefix hits go through snapshots (worker_proc/state_group.py), speculative decoding
through the state after each token of a chunk that verifies drafts, which a layer keeps where
`StateMetadata.kept` says and the worker restores after the accepted ones; beams are not forked (refused).
Usage: subclass, implement `state_spec(dtype)`; in `forward`, `states = self.bound()`, `metadata =
batch.metadata_for(self)`, and `for rows, slots, keep in token_offsets(metadata)` for a token-by-token recurrence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from rapid_llm.ops.attention.kv_cache_spec import StateSpec

STATE_GROUP = "state"  # the cache group every state layer belongs to


@dataclass
class StateMetadata:
    """Device tensors every state layer reads in one forward (tokens are flat, sequence after sequence)."""

    slots: torch.Tensor  # [num_seqs] int64: each sequence's state row (its input-batch slot)
    token_slots: torch.Tensor  # [num_tokens] int64: the state row of each token's sequence
    query_start_loc: torch.Tensor  # [num_seqs + 1] int64: where each sequence's tokens start
    has_initial_state: torch.Tensor  # [num_seqs] bool: False where the chunk starts at token 0 (row zeroed)
    max_query_len: int  # the most tokens one sequence computes (host int: a token-by-token loop's bound)
    # Speculative decoding: the tokens of chunks verifying drafts, whose states (after each) are kept; None: none.
    kept: KeptStates | None = None


@dataclass
class KeptStates:
    """Tokens whose state after them a layer keeps in other rows: flat, and per offset for token-by-token loops."""

    tokens: torch.Tensor  # [K] int64 flat token indices
    targets: torch.Tensor  # [K] int64 rows their states are kept in
    # offset t -> (index among the sequences that have a t-th token, target rows), for the offsets with any
    by_offset: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


class Offset(NamedTuple):
    rows: torch.Tensor  # flat indices of every sequence's t-th new token
    slots: torch.Tensor  # those sequences' state rows
    keep: tuple[torch.Tensor, torch.Tensor] | None  # (index into rows, target rows) of the states kept after them


def token_offsets(metadata: StateMetadata) -> Iterator[Offset]:
    """For t = 0, 1, ...: every sequence's t-th new token and its state row, and which of those tokens' states are
    kept. A recurrence that folds one token at a time loops over these, every sequence of the step at once."""
    starts = metadata.query_start_loc[:-1]
    lengths = metadata.query_start_loc[1:] - starts
    kept = {} if metadata.kept is None else metadata.kept.by_offset
    for offset in range(metadata.max_query_len):
        active = lengths > offset
        yield Offset(starts[active] + offset, metadata.slots[active], kept.get(offset))


class StateLayer(nn.Module, ABC):
    cache_group = STATE_GROUP

    def __init__(self) -> None:
        super().__init__()
        self.states: tuple[torch.Tensor, ...] | None = None

    @abstractmethod
    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        """What this layer keeps per request, given the model dtype."""

    def bind(self, states: tuple[torch.Tensor, ...]) -> None:
        self.states = states

    def bound(self) -> tuple[torch.Tensor, ...]:
        if self.states is None:
            raise RuntimeError("state layer used before the worker bound it to its state tensors")
        return self.states
