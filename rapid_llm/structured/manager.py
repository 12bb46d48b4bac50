"""StructuredOutputs: the worker's grammar state for every slot, and the per-step bitmask and accept calls.

Key design choice: matchers live in the worker, which executes steps strictly in order and learns each
step's sampled tokens before it builds the next step's mask. The scheduler's one-step lag (async
scheduling plans step N + 1 before step N's tokens are known) therefore never reaches a matcher: by the
time step N + 1 samples, `accept` has already advanced it with step N's token. A request whose grammar
is still compiling only blocks the step in which it samples (`wait_for_grammars`); its prefill steps run
while the pool compiles.
Usage (worker): `add(slot, params, outputs)` / `remove(slot)`; per step `wait_for_grammars(sampling_slots)`,
`mask = fill_bitmask(sampling_slots, device)` before sampling, `accept(slots, tokens)` after.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
import torch

from rapid_llm.sampling import SamplingParams
from rapid_llm.structured.compiler import GrammarCompilerPool
from rapid_llm.structured.grammar_spec import GrammarSpec
from rapid_llm.structured.request_matcher import GrammarRejectedToken, RequestMatcher

logger = logging.getLogger(__name__)


class StructuredOutputs:
    def __init__(self, compilers: GrammarCompilerPool) -> None:
        self.compilers = compilers
        self.num_words = (compilers.vocab_size + 31) // 32
        self._matchers: dict[int, RequestMatcher] = {}

    def add(self, slot: int, params: SamplingParams, output_token_ids: Sequence[int]) -> None:
        """Start the slot's compile (if its request has structured output); outputs are replayed later."""
        self._matchers.pop(slot, None)
        if params.structured_outputs is None:
            return
        future = self.compilers.submit(GrammarSpec.of(params.structured_outputs))
        self._matchers[slot] = RequestMatcher(future, output_token_ids, self.compilers.eos_token_ids)

    def remove(self, slot: int) -> None:
        self._matchers.pop(slot, None)

    @property
    def active(self) -> bool:
        """Whether any slot has a grammar (the next step's mask then needs this step's tokens first)."""
        return bool(self._matchers)

    def wait_for_grammars(self, sampling_slots: Sequence[int]) -> dict[int, str]:
        """Make the matcher of every slot that samples this step ready; slot -> error of those that
        cannot be (their grammar failed to compile), whose slots the caller fails alone."""
        errors = {}
        for slot in sampling_slots:
            matcher = self._matchers.get(slot)
            if matcher is None:
                continue
            try:
                matcher.ready()
            except Exception as error:
                logger.warning("slot %d: structured output failed: %s", slot, error)
                errors[slot] = f"structured output: {error}"
                del self._matchers[slot]
        return errors

    def fill_bitmask(self, sampling_slots: Sequence[int], device: torch.device) -> torch.Tensor | None:
        """int32 [len(sampling_slots), ceil(V / 32)] allowed-token bits, one row per slot that samples (all
        ones for slots without a grammar), on `device`; None when no slot has one, so plain batches pay nothing."""
        constrained = [(row, self._matchers[slot]) for row, slot in enumerate(sampling_slots) if slot in self._matchers]
        if not constrained:
            return None
        bitmask = torch.full((len(sampling_slots), self.num_words), -1, dtype=torch.int32,
                             pin_memory=device.type == "cuda")
        for row, matcher in constrained:
            matcher.fill(bitmask, row)
        return bitmask.to(device, non_blocking=True)

    def accept(self, slots: Sequence[int], token_ids: Sequence[int]) -> dict[int, str]:
        """Advance each constrained slot's matcher with the token its request just sampled; slot -> error
        of those whose token the grammar rejects (a row with every token masked, e.g. min_tokens forbidding
        the EOS a complete grammar needs), which the caller fails alone."""
        errors = {}
        for slot, token in zip(slots, token_ids):
            matcher = self._matchers.get(slot)
            if matcher is None:
                continue
            try:
                matcher.accept(token)
            except GrammarRejectedToken as error:
                logger.warning("slot %d: %s", slot, error)
                errors[slot] = f"structured output: {error}"
                del self._matchers[slot]
        return errors
