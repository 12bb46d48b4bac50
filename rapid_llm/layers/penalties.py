"""Repetition, frequency and presence penalties applied to a batch of logits.

Uses the dense [B, V] token counts that `SamplingBatch.build` scattered on the device, so every
penalty is a handful of elementwise ops with per-row parameters broadcast over the vocabulary.
Repetition follows HF/vLLM (prompt and output tokens, sign-aware); frequency and presence follow
OpenAI (output tokens only).
"""

from __future__ import annotations

import torch

from rapid_llm.layers.sampling_batch import SamplingBatch


def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Return float32 `logits` [B, V] with the batch's penalties applied; the input is not modified."""
    logits = logits.float()
    counts = batch.output_counts
    if counts is None:
        return logits
    in_output = counts > 0
    if batch.prompt_mask is not None:
        seen = in_output | batch.prompt_mask
        penalty = batch.repetition_penalty.unsqueeze(1)
        # Dividing a positive logit and multiplying a negative one both make the token less likely.
        penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, penalised, logits)
    logits = logits - batch.frequency_penalty.unsqueeze(1) * counts
    return logits - batch.presence_penalty.unsqueeze(1) * in_output
