"""The parity check every MoE model's variant tests run: fp32 prefill logits within 1e-3 of transformers'
and NEW_TOKENS greedy tokens equal to its generate(do_sample=False), with mixed-length prompts, chunked
prefill and staggered arrivals (prefill chunks in the same steps as other requests' decodes)."""

from __future__ import annotations

from pathlib import Path

import torch

from rapid_llm.sampling import SamplingParams
from tests.hf_reference import hf_greedy, hf_logits, hf_model
from tests.models.paged_generation import generate, prefill_logits
from tests.models.test_hf_parity import NEW_TOKENS, _prompts, _runner

LOGIT_TOLERANCE = 1e-3


def assert_matches_transformers(checkpoint: Path, lengths: tuple[int, ...] = (9, 23, 31)) -> float:
    """Run both checks; return the largest absolute fp32 logit difference seen."""
    runner = _runner(checkpoint, block_size=5)
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=lengths, seed=5)
    max_diff = max((ours - hf_logits(hf, prompt)).abs().max().item()
                   for ours, prompt in zip(prefill_logits(runner, prompts), prompts))
    assert max_diff <= LOGIT_TOLERANCE
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    sequences = generate(runner, prompts, params, chunk_size=8, stagger=2)
    assert [s.output for s in sequences] == hf_greedy(hf, prompts, NEW_TOKENS)
    return max_diff
