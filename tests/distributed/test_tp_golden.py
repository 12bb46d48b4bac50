"""Tensor parallelism end to end on CPU (gloo): `LLM(..., tensor_parallel_size=2)` gives the same greedy tokens
as one rank and as transformers, and the same log-probabilities as transformers.

The tiny Llama has 4 attention heads and 2 KV heads (2 of each per rank) and an untied LM head. fp32: the
ranks change only the order of the row-parallel sums, so prompt and output log-probabilities stay within
1e-4 of transformers' log_softmax (LOGPROB_TOLERANCE; measured ~1e-6).
"""

from __future__ import annotations

import pytest
import torch

from rapid_llm import LLM, SamplingParams
from tests.hf_reference import hf_greedy, hf_logits, hf_model

NEW_TOKENS = 32
TOP_LOGPROBS = 5
LOGPROB_TOLERANCE = 1e-4
PROMPT_LENGTHS = (7, 30)
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=TOP_LOGPROBS,
                        prompt_logprobs=TOP_LOGPROBS)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def hf(checkpoint):
    return hf_model(checkpoint)


def _generate(checkpoint, prompts, tensor_parallel_size: int):
    with LLM(model=str(checkpoint), tensor_parallel_size=tensor_parallel_size, num_kv_blocks=64) as llm:
        return llm.generate(prompts, GREEDY)


@pytest.fixture(scope="module")
def tp2_outputs(checkpoint, prompts):
    return _generate(checkpoint, prompts, 2)


def test_tp2_greedy_tokens_equal_tp1_and_transformers(checkpoint, prompts, hf, tp2_outputs) -> None:
    tp2 = [output.token_ids for output in tp2_outputs]
    assert tp2 == hf_greedy(hf, prompts, NEW_TOKENS)
    assert tp2 == [output.token_ids for output in _generate(checkpoint, prompts, 1)]


def test_tp2_logprobs_match_transformers(prompts, hf, tp2_outputs) -> None:
    worst = 0.0
    for prompt, result in zip(prompts, tp2_outputs):
        output = result.outputs[0]
        reference = hf_logits(hf, [*prompt, *output.token_ids]).log_softmax(dim=-1)
        # Prompt token j + 1 is predicted at position j; output token i at position len(prompt) + i - 1.
        scored = [(j, prompt[j + 1], entry) for j, entry in enumerate(output.prompt_logprobs)]
        scored += [(len(prompt) + i - 1, token, entry)
                   for i, (token, entry) in enumerate(zip(output.token_ids, output.logprobs))]
        assert len(scored) == len(prompt) - 1 + NEW_TOKENS
        for position, token, entry in scored:
            expected_top = reference[position].topk(TOP_LOGPROBS).values
            worst = max(worst, abs(entry.logprob - reference[position, token].item()),
                        (torch.tensor(entry.top_logprobs) - expected_top).abs().max().item())
    assert worst <= LOGPROB_TOLERANCE
