"""What the tensor-parallel golden tests share: greedy generation with logprobs through the offline LLM, the
largest difference of its prompt and output log-probabilities from transformers' log_softmax, and the check
built from both (`assert_matches_transformers`)."""

from __future__ import annotations

from typing import Sequence

import torch
import transformers

from rapid_llm import LLM, SamplingParams
from rapid_llm.entrypoints.llm import RequestOutput
from tests.hf_reference import hf_greedy, hf_logits, hf_model

NEW_TOKENS = 32
TOP_LOGPROBS = 5
# fp32: the ranks only reorder the row-parallel sums (measured 5e-6 to 9e-6 on the tiny checkpoints).
LOGPROB_TOLERANCE = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=TOP_LOGPROBS,
                        prompt_logprobs=TOP_LOGPROBS)


def random_prompts(lengths: Sequence[int], seed: int = 5) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 500, (n,), generator=generator).tolist() for n in lengths]


def generate(checkpoint, prompts: list[list[int]], tensor_parallel_size: int,
             params: list[SamplingParams] | None = None, **engine_args) -> list[RequestOutput]:
    """Greedy (GREEDY) unless `params` gives one SamplingParams per prompt; `engine_args` go to `LLM` (64 KV blocks
    unless they say otherwise)."""
    engine_args = {"num_kv_blocks": 64, **engine_args}
    with LLM(model=str(checkpoint), tensor_parallel_size=tensor_parallel_size, **engine_args) as llm:
        return llm.generate(prompts, params or GREEDY)


def logprob_error(prompts: list[list[int]], hf: transformers.PreTrainedModel, results: list[RequestOutput]) -> float:
    """max |ours - transformers'| over every scored prompt token, sampled token and top-k logprob."""
    worst = 0.0
    for prompt, result in zip(prompts, results):
        output = result.outputs[0]
        reference = hf_logits(hf, [*prompt, *output.token_ids]).log_softmax(dim=-1)
        # Prompt token j + 1 is predicted at position j; output token i at position len(prompt) + i - 1.
        scored = [(j, prompt[j + 1], entry) for j, entry in enumerate(output.prompt_logprobs)]
        scored += [(len(prompt) + i - 1, token, entry)
                   for i, (token, entry) in enumerate(zip(output.token_ids, output.logprobs))]
        if len(scored) != len(prompt) - 1 + NEW_TOKENS:
            raise AssertionError(f"{len(scored)} scored tokens, expected {len(prompt) - 1 + NEW_TOKENS}")
        for position, token, entry in scored:
            expected_top = reference[position].topk(TOP_LOGPROBS).values
            worst = max(worst, abs(entry.logprob - reference[position, token].item()),
                        (torch.tensor(entry.top_logprobs) - expected_top).abs().max().item())
    return worst


def assert_matches_transformers(checkpoint, tensor_parallel_size: int, label: str,
                                tolerance: float = LOGPROB_TOLERANCE, **engine_args) -> list[RequestOutput]:
    """Two prompts through `tensor_parallel_size` ranks: greedy tokens are transformers', logprobs within
    `tolerance` of its log_softmax (the difference is printed under `label`). Returns the outputs."""
    prompts = random_prompts((6, 21), seed=9)
    hf = hf_model(checkpoint)
    outputs = generate(checkpoint, prompts, tensor_parallel_size, **engine_args)
    assert [output.token_ids for output in outputs] == hf_greedy(hf, prompts, NEW_TOKENS)
    error = logprob_error(prompts, hf, outputs)
    print(f"{label}: max logprob difference {error:.2e}")
    assert error <= tolerance
    return outputs
