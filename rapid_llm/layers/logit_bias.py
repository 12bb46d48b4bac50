"""LogitBias: OpenAI's `logit_bias` (token id -> value added to its logit) for the rows of one step.

Kept sparse: a few (row, token, bias) triples scattered into the logits with one `index_put_`, since a
request biases a handful of tokens out of a vocabulary of tens of thousands. SamplingParams.validate has
checked the values against [-100, 100] and the scheduler's admission the ids against the vocabulary;
`build` still refuses ids past the logits rather than scatter out of bounds.
Usage: `bias = LogitBias.build(params_per_row, vocab_size, device)` (None if no row has one);
`bias.apply(logits)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rapid_llm.sampling import SamplingParams


@dataclass
class LogitBias:
    rows: torch.Tensor  # [N] int64
    token_ids: torch.Tensor  # [N] int64
    values: torch.Tensor  # [N] float32

    @classmethod
    def build(cls, params: Sequence[SamplingParams], vocab_size: int, device: torch.device) -> LogitBias | None:
        entries = [(row, token, bias) for row, p in enumerate(params) if p.logit_bias
                   for token, bias in p.logit_bias.items()]
        if not entries:
            return None
        outside = [token for _, token, _ in entries if not 0 <= token < vocab_size]
        if outside:
            raise ValueError(f"logit_bias has token ids outside the vocabulary [0, {vocab_size}): {outside[:5]}")
        rows, token_ids, values = zip(*entries)
        return cls(torch.tensor(rows, dtype=torch.int64, device=device),
                   torch.tensor(token_ids, dtype=torch.int64, device=device),
                   torch.tensor(values, dtype=torch.float32, device=device))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Add the biases into float32 `logits` [B, V] in place; returns it."""
        return logits.index_put_((self.rows, self.token_ids), self.values, accumulate=True)
