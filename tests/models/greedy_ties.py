"""Greedy paths of two correct bf16 implementations, compared up to near-ties: shared by the on/off tests of
CPU kernels that round differently from the path they replace.

Two kernels that sum or round in another order move a bf16 model's logits by rounding, and a greedy path may
part where its top two tokens are tied within that rounding. `assert_greedy_equal_up_to_ties` requires the
tokens to be equal up to the first place the paths part, the reference's top two log-probabilities to be
within `tie` there, and at least half of all tokens to be compared before any parting.
"""

from __future__ import annotations

from typing import Sequence

from tests.models.paged_generation import _Sequence


def tokens_and_gaps(sequences: Sequence[_Sequence]) -> list[tuple[list[int], list[float]]]:
    """Per sequence: its greedy tokens and, at each, the gap between the top two log-probabilities
    (generated with `logprobs=2`)."""
    return [(s.output, [top.top_logprobs[0] - top.top_logprobs[1] for top in s.logprobs]) for s in sequences]


def assert_greedy_equal_up_to_ties(ours: list[tuple[list[int], list[float]]],
                                   reference: list[tuple[list[int], list[float]]], tie: float) -> None:
    compared = total = 0
    for (tokens, _), (expected, gaps) in zip(ours, reference, strict=True):
        assert len(tokens) == len(expected)
        parted = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
        if parted is not None:
            assert gaps[parted] < tie, f"the paths part at token {parted}, where the top two differ by {gaps[parted]}"
        compared += len(tokens) if parted is None else parted
        total += len(tokens)
    assert compared >= total // 2, (compared, total)
