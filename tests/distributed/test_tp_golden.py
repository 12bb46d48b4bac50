"""Tensor parallelism end to end on CPU (gloo): `LLM(..., tensor_parallel_size=2)` gives the same greedy tokens
as one rank and as transformers, and the same log-probabilities as transformers (within LOGPROB_TOLERANCE).

The tiny Llama has 4 attention heads and 2 KV heads (2 and 1 per rank) and an untied LM head. A third,
randomly sampled (unseeded) request runs in the same batch: each rank's token pool feeds the next step, so
its logprobs match transformers on the tokens rank 0 returned only if every rank used rank 0's tokens.
"""

from __future__ import annotations

import pytest

from rapid_llm import SamplingParams
from tests.distributed.golden import (GREEDY, LOGPROB_TOLERANCE, NEW_TOKENS, TOP_LOGPROBS, generate, logprob_error,
                                      random_prompts)
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


SAMPLED = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=TOP_LOGPROBS,
                         prompt_logprobs=TOP_LOGPROBS)


@pytest.fixture(scope="module")
def tp2_run(checkpoint, prompts):
    """(greedy outputs, sampled output) of one tp=2 engine; the sampled request reuses the last prompt."""
    outputs = generate(checkpoint, [*prompts, prompts[-1]], 2, [GREEDY] * len(prompts) + [SAMPLED])
    return outputs[:-1], outputs[-1]


@pytest.fixture(scope="module")
def tp2_outputs(tp2_run):
    return tp2_run[0]


def test_tp2_greedy_tokens_equal_tp1_and_transformers(checkpoint, prompts, hf, tp2_outputs) -> None:
    tp2 = [output.token_ids for output in tp2_outputs]
    assert tp2 == hf_greedy(hf, prompts, NEW_TOKENS)
    assert tp2 == [output.token_ids for output in generate(checkpoint, prompts, 1)]


def test_tp2_logprobs_match_transformers(prompts, hf, tp2_outputs) -> None:
    assert logprob_error(prompts, hf, tp2_outputs) <= LOGPROB_TOLERANCE


def test_tp2_random_sampling_keeps_ranks_consistent(prompts, hf, tp2_run) -> None:
    sampled = tp2_run[1]
    assert len(sampled.token_ids) == NEW_TOKENS
    assert logprob_error(prompts[-1:], hf, [sampled]) <= LOGPROB_TOLERANCE


def test_tp2_speculative_decoding_keeps_greedy_tokens(checkpoint, hf) -> None:
    """n-gram drafts verified on 2 ranks: every rank accepts rank 0's tokens, so greedy output stays transformers'."""
    repetitive = [[5, 6, 7, 8] * 6, [40, 41, 40, 41, 40, 41, 40]]
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    outputs = generate(checkpoint, repetitive, 2, speculative_config=config)
    assert [output.outputs[0].token_ids for output in outputs] == hf_greedy(hf, repetitive, NEW_TOKENS)
