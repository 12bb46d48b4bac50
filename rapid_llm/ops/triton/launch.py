"""Host-side helpers the Triton op wrappers share: warp counts, the kept states of the state ops by token, and the
launch of the recurrent state ops (a program per sequence, head and block of a head's state, looping over tokens).

Kernels address rows by a row stride and expect the last dim contiguous (`ops/tensor_rows.rows_of`), so
a strided view (e.g. q split out of a merged qkv projection) is passed without a copy.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from rapid_llm.ops.state_metadata import StateMetadata


def warps_for(block: int) -> int:
    """Warps for a program working on `block` elements: about 256 elements per warp, 1 to 16 warps."""
    return min(max(block // 256, 1), 16)


def kept_by_token(metadata: StateMetadata, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(starts [num_tokens + 1], tokens [K], targets [K]): the kept states sorted by token, token t's being entries
    starts[t] to starts[t + 1]; None when the step keeps nothing. A kernel walking tokens finds a token's rows without
    a search, and a token kept twice (a draft's scratch row and a snapshot) is written to both. No host sync."""
    if metadata.kept is None:
        return None
    tokens, order = metadata.kept.tokens.sort()
    starts = torch.searchsorted(tokens, torch.arange(num_tokens + 1, device=tokens.device))
    return starts, tokens, metadata.kept.targets[order]


class TokenLoop(NamedTuple):
    """How a recurrent state op's kernel is launched."""

    grid: tuple[int, int, int]  # (sequence, head, block of the state's columns)
    block: int  # columns of a head's state per program
    kept_starts: torch.Tensor | None  # token t's kept states: entries kept_starts[t] to kept_starts[t + 1] ...
    kept_targets: torch.Tensor | None  # ... of these rows; both None when the step keeps nothing


def token_loop(metadata: StateMetadata, num_tokens: int, num_heads: int, columns: int, max_block: int) -> TokenLoop:
    """The launch of a kernel holding a block of at most `max_block` of a head state's `columns` in registers while
    it folds its sequence's tokens in, one after another."""
    kept = kept_by_token(metadata, num_tokens)
    block = min(max_block, triton.next_power_of_2(columns))
    grid = (metadata.slots.shape[0], num_heads, triton.cdiv(columns, block))
    return TokenLoop(grid, block, *((None, None) if kept is None else (kept[0], kept[2])))


def check_state(op: str, state: torch.Tensor, shape: tuple[int, ...]) -> None:
    """A state op's state must be [rows, *shape], its last dim contiguous (the kernels update it in place)."""
    if state.shape[1:] != shape or state.stride(-1) != 1:
        raise ValueError(f"{op}: the state {tuple(state.shape)} must be [rows, {', '.join(map(str, shape))}] with its "
                         "last dim contiguous (it is updated in place)")
