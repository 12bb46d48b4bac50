"""The one context-length check and the `n` fan-out every entry point shares."""

from __future__ import annotations

import pytest

from rapid_llm.sampling import ContextLengthError, SamplingParams, check_prompt_length, fit_max_tokens


def test_fit_max_tokens_returns_what_fits() -> None:
    assert fit_max_tokens(10, 6, 16) == 6
    assert fit_max_tokens(10, None, 16) == 6  # None takes the rest of the context


@pytest.mark.parametrize(
    ("num_prompt_tokens", "max_tokens", "too_long", "message"),
    [
        (0, 4, "empty", "at least 1"),
        (16, None, "prompt", "fewer than max_model_len"),
        (10, 7, "total", r"prompt \(10 tokens\) \+ max_tokens \(7\) exceeds max_model_len 16"),
    ],
)
def test_fit_max_tokens_raises_a_typed_error(num_prompt_tokens: int, max_tokens: int | None, too_long: str,
                                             message: str) -> None:
    with pytest.raises(ContextLengthError, match=message) as excinfo:
        fit_max_tokens(num_prompt_tokens, max_tokens, 16)
    error = excinfo.value
    assert (error.too_long, error.num_prompt_tokens, error.max_tokens, error.max_model_len) == (
        too_long, num_prompt_tokens, None if too_long != "total" else max_tokens, 16)


def test_check_prompt_length_ignores_max_tokens() -> None:
    check_prompt_length(15, 16)
    with pytest.raises(ContextLengthError, match="fewer than"):
        check_prompt_length(16, 16)


def test_per_choice_gives_n_single_choices_with_consecutive_seeds() -> None:
    choices = SamplingParams(n=3, seed=7, temperature=0.5).per_choice()
    assert [(c.n, c.seed, c.temperature) for c in choices] == [(1, 7, 0.5), (1, 8, 0.5), (1, 9, 0.5)]
    assert [c.seed for c in SamplingParams(n=2).per_choice()] == [None, None]
