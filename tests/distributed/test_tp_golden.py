"""Tensor parallelism end to end on CPU (gloo): `LLM(..., tensor_parallel_size=2)` gives the same greedy tokens
as one rank and as transformers, and the same log-probabilities as transformers (within LOGPROB_TOLERANCE).

The tiny Llama has 4 attention heads and 2 KV heads (2 and 1 per rank) and an untied LM head.
"""

from __future__ import annotations

import pytest

from tests.distributed.golden import LOGPROB_TOLERANCE, NEW_TOKENS, generate, logprob_error, random_prompts
from tests.hf_reference import hf_greedy, hf_model


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts((7, 30))


@pytest.fixture(scope="module")
def hf(checkpoint):
    return hf_model(checkpoint)


@pytest.fixture(scope="module")
def tp2_outputs(checkpoint, prompts):
    return generate(checkpoint, prompts, 2)


def test_tp2_greedy_tokens_equal_tp1_and_transformers(checkpoint, prompts, hf, tp2_outputs) -> None:
    tp2 = [output.token_ids for output in tp2_outputs]
    assert tp2 == hf_greedy(hf, prompts, NEW_TOKENS)
    assert tp2 == [output.token_ids for output in generate(checkpoint, prompts, 1)]


def test_tp2_logprobs_match_transformers(prompts, hf, tp2_outputs) -> None:
    assert logprob_error(prompts, hf, tp2_outputs) <= LOGPROB_TOLERANCE
