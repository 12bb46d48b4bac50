"""RequestMatcher: one engine request's grammar state (an xgrammar GrammarMatcher) in the worker.

Key design choice: the matcher is built lazily, the first time the request samples, from its compile
future plus the tokens the request already generated. A request resumed after preemption (recompute:
re-added with its outputs) thus gets a fresh matcher advanced through exactly the outputs the scheduler
kept, which is the rollback of whatever the discarded steps had accepted. Once the grammar has taken
EOS (terminated), only EOS stays allowed: the step the scheduler planned before it saw that EOS
(async scheduling) samples one more token, which the scheduler drops, and with ignore_eos the output
is the grammar's text followed by EOS tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import xgrammar


class GrammarRejectedToken(RuntimeError):
    """A token the grammar does not allow reached the matcher (a masking bug, never a user error)."""


class RequestMatcher:
    def __init__(self, grammar: Future[xgrammar.CompiledGrammar], output_token_ids: Sequence[int],
                 stop_token_ids: Sequence[int]) -> None:
        self._grammar = grammar
        self._replay = list(output_token_ids)
        self._stop_token_ids = list(stop_token_ids)
        self._matcher: xgrammar.GrammarMatcher | None = None

    def ready(self) -> xgrammar.GrammarMatcher:
        """The matcher at the request's current output; waits for the compile (raises what it raised)."""
        if self._matcher is None:
            import xgrammar

            matcher = xgrammar.GrammarMatcher(self._grammar.result())
            for token in self._replay:
                if matcher.is_terminated():
                    break
                if not matcher.accept_token(token):
                    raise GrammarRejectedToken(f"resumed output token {token} does not match the grammar")
            self._matcher, self._replay = matcher, []
        return self._matcher

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write this request's allowed next tokens into row `row` of the host int32 bitmask."""
        matcher = self.ready()
        if not matcher.is_terminated():
            matcher.fill_next_token_bitmask(bitmask, row)
            return
        bitmask[row] = 0
        for token in self._stop_token_ids:
            bitmask[row, token // 32] |= _bit(token % 32)

    def accept(self, token: int) -> None:
        matcher = self.ready()
        if matcher.is_terminated():
            return
        if not matcher.accept_token(token):
            raise GrammarRejectedToken(f"sampled token {token} does not match the grammar")


def _bit(index: int) -> int:
    """Bit `index` of an int32 word as a Python int in int32's range (bit 31 is the sign)."""
    return -(1 << 31) if index == 31 else 1 << index
