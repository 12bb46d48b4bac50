"""What a forward's state layers read about the step: each sequence's state row and tokens (`StateMetadata`).

The worker's state cache group builds one per step (worker_proc/state_group.py); the state ops (causal_conv,
gated_delta_rule, ...) take it beside their tensors. `KeptStates` names the tokens whose state after them is kept
in other rows (speculative decoding); `token_offsets` yields, offset by offset, every sequence's t-th token, for
recurrences that fold one token at a time over all sequences of the step at once.
Usage: `for rows, slots, keep in token_offsets(metadata): ...`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from rapid_llm.utils.host_staging import to_device


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


def kept_states(query_lens: Sequence[int], kept: Sequence[tuple[int, int, int]], device: torch.device
                ) -> KeptStates | None:
    """The KeptStates of `kept` (sequence, offset in its chunk, target row) for a step of `query_lens` tokens per
    sequence, staged to `device` at once; None when nothing is kept."""
    if not kept:
        return None
    lengths = torch.tensor(list(query_lens))
    seqs, offsets, targets = (torch.tensor(column) for column in zip(*kept))
    tokens = (lengths.cumsum(0) - lengths)[seqs] + offsets
    # A token's index among the sequences that have one at its offset (what a token loop's `rows` holds).
    earlier = torch.arange(len(lengths)) < seqs[:, None]
    ranks = (earlier & (lengths > offsets[:, None])).sum(dim=1)
    by_offset = [(offset, offsets == offset) for offset in offsets.unique().tolist()]
    host = [tokens, targets, *(part for _, mask in by_offset for part in (ranks[mask], targets[mask]))]
    staged = to_device(host, device)
    return KeptStates(staged[0], staged[1], {offset: (staged[2 + 2 * i], staged[3 + 2 * i])
                                             for i, (offset, _) in enumerate(by_offset)})
