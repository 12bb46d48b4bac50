"""Mamba2's scan (ops/ssd.py): the token-by-token reference against transformers' chunked scan, and the chunked form
against the reference on a mixed step (long prefills over several chunks, a chunk continuing from its state, a
decode) with states kept inside a long prefill, as state snapshots keep them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

from rapid_llm.ops.ssd import ssd_scan, ssd_scan_chunked
from rapid_llm.ops.state_metadata import StateMetadata, kept_states

HEADS, GROUPS, HEAD_DIM, STATE_DIM = 4, 2, 8, 16


def _step(lengths: list[int], slots: list[int], fresh: list[bool], kept: list[tuple[int, int, int]] | None = None
          ) -> StateMetadata:
    query_lens = torch.tensor(lengths)
    slot_rows = torch.tensor(slots)
    return StateMetadata(slot_rows, torch.repeat_interleave(slot_rows, query_lens), F.pad(query_lens.cumsum(0), (1, 0)),
                         ~torch.tensor(fresh), max(lengths), kept_states(lengths, kept or [], torch.device("cpu")))


def _inputs(num_tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    """x, dt (after softplus), A, B, C, D as the mixer passes them."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator)

    scale = STATE_DIM**-0.5
    return (randn(num_tokens, HEADS, HEAD_DIM), F.softplus(randn(num_tokens, HEADS) - 1), -(randn(HEADS) * 0.5).exp(),
            randn(num_tokens, GROUPS, STATE_DIM) * scale, randn(num_tokens, GROUPS, STATE_DIM) * scale, randn(HEADS))


def _state(rows: int) -> torch.Tensor:
    return torch.randn(rows, HEADS, HEAD_DIM, STATE_DIM, generator=torch.Generator().manual_seed(7)) * 0.1


def test_the_reference_matches_transformers_chunked_scan() -> None:
    lengths, slots = [37, 5], [3, 1]
    x, dt, A, B, C, D = _inputs(sum(lengths), seed=0)
    state = _state(5)
    initial = state.clone()
    output = ssd_scan(x, dt, A, B, C, D, state, _step(lengths, slots, [False, False]))
    start = 0
    for length, slot in zip(lengths, slots):
        tokens = slice(start, start + length)
        expected, final = mamba2_chunk_scan(x[None, tokens], dt[None, tokens], A, B[None, tokens], C[None, tokens],
                                            chunk_size=8, D=D, initial_states=initial[slot:slot + 1],
                                            return_final_states=True)
        torch.testing.assert_close(output[tokens], expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state[slot], final[0], rtol=1e-5, atol=1e-5)
        start += length
    untouched = [row for row in range(5) if row not in slots]
    assert torch.equal(state[untouched], initial[untouched])


def test_a_kept_state_is_the_state_after_its_token() -> None:
    x, dt, A, B, C, D = _inputs(12, seed=1)
    state = _state(4)
    initial = state.clone()
    ssd_scan(x, dt, A, B, C, D, state, _step([12], [0], [False], kept=[(0, 4, 2)]))
    alone = initial.clone()
    ssd_scan(x[:5], dt[:5], A, B[:5], C[:5], D, alone, _step([5], [0], [False]))
    torch.testing.assert_close(state[2], alone[0], rtol=1e-6, atol=1e-6)


def test_the_chunked_form_matches_the_reference_on_a_mixed_step() -> None:
    # A long prefill continuing from its state over four chunks (states kept inside it and at its end), a fresh
    # one just over a chunk, a short chunk continuing from its state, a decode.
    lengths, slots, fresh = [200, 70, 10, 1], [8, 5, 6, 9], [False, True, False, False]
    kept = [(0, 15, 0), (0, 63, 1), (0, 64, 2), (0, 199, 3), (1, 69, 4)]
    x, dt, A, B, C, D = _inputs(sum(lengths), seed=2)
    state = _state(10)
    state[5] = 0.0  # the state group zeroes a fresh sequence's row
    reference_state = state.clone()
    expected = ssd_scan(x, dt, A, B, C, D, reference_state, _step(lengths, slots, fresh, kept))
    output = ssd_scan_chunked(x, dt, A, B, C, D, state, _step(lengths, slots, fresh, kept))
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, reference_state, rtol=1e-5, atol=1e-5)
