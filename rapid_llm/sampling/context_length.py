"""Whether a prompt, and the output asked for after it, fit in the model's context.

One check for every entry point (HTTP frontend, offline `LLM`, scheduler); each turns the typed
`ContextLengthError` into its own error shape, using the numbers the error carries.
"""

from __future__ import annotations

from typing import Literal

TooLong = Literal["empty", "prompt", "total"]


class ContextLengthError(ValueError):
    """`too_long`: "empty" (no prompt tokens), "prompt" (the prompt leaves no room for output) or
    "total" (prompt + max_tokens exceed max_model_len)."""

    def __init__(self, too_long: TooLong, num_prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                 message: str) -> None:
        super().__init__(message)
        self.too_long = too_long
        self.num_prompt_tokens = num_prompt_tokens
        self.max_tokens = max_tokens
        self.max_model_len = max_model_len


def check_prompt_length(num_prompt_tokens: int, max_model_len: int) -> None:
    """Raise `ContextLengthError` unless the prompt has at least 1 and fewer than max_model_len tokens."""
    if num_prompt_tokens < 1:
        raise ContextLengthError("empty", num_prompt_tokens, None, max_model_len,
                                 "the prompt has no tokens; it needs at least 1")
    if num_prompt_tokens >= max_model_len:
        raise ContextLengthError(
            "prompt", num_prompt_tokens, None, max_model_len,
            f"the prompt has {num_prompt_tokens} tokens; it needs fewer than max_model_len ({max_model_len})",
        )


def fit_max_tokens(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """`max_tokens`, or all the context the prompt leaves when None; `ContextLengthError` if it does not fit."""
    check_prompt_length(num_prompt_tokens, max_model_len)
    if max_tokens is None:
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_model_len:
        raise ContextLengthError(
            "total", num_prompt_tokens, max_tokens, max_model_len,
            f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds max_model_len {max_model_len}",
        )
    return max_tokens
