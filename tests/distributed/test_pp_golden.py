"""Pipeline parallelism end to end on CPU (gloo): `LLM(..., pipeline_parallel_size=2)` splits the decoder layers
into two stages (hidden states and residual sent stage to stage, the last stage samples and broadcasts its tokens)
and gives transformers' greedy tokens and log-probabilities (within LOGPROB_TOLERANCE), alone and with tensor
parallelism (TP=2 x PP=2, four ranks), on Llama (untied head), Qwen3-MoE and DeepSeek-V3 (MLA), with chunked
prefill, prefix caching and async scheduling on (the defaults). Greedy tokens also equal one rank's; a randomly
sampled request shows every stage records the last stage's tokens; an uneven --pp-layer-partition and tied
embeddings (the last stage keeps the embedding for its head) run too.
"""

from __future__ import annotations

import pytest

from rapid_llm import SamplingParams
from tests.distributed.golden import (GREEDY, LOGPROB_TOLERANCE, NEW_TOKENS, TOP_LOGPROBS, assert_matches_transformers,
                                      generate, logprob_error, random_prompts)
from tests.hf_reference import hf_model

ARCHITECTURES = {"llama": ("LlamaForCausalLM", {}), "qwen3-moe": ("Qwen3MoeForCausalLM", {}),
                 "deepseek-v3": ("DeepseekV3ForCausalLM", {})}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_pp2_matches_transformers(tiny_checkpoint, name: str) -> None:
    architecture, overrides = ARCHITECTURES[name]
    checkpoint = tiny_checkpoint(architecture, **overrides)
    assert_matches_transformers(checkpoint, 1, f"{name} pp=2", pipeline_parallel_size=2,
                                max_num_batched_tokens=16)


def test_tp2_pp2_matches_transformers(tiny_checkpoint) -> None:
    assert_matches_transformers(tiny_checkpoint("LlamaForCausalLM"), 2, "llama tp=2 x pp=2", pipeline_parallel_size=2)


def test_uneven_partition_and_tied_embeddings(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("Qwen3ForCausalLM", num_hidden_layers=3, tie_word_embeddings=True)
    assert_matches_transformers(checkpoint, 1, "qwen3 tied pp=2 (1,2)", pipeline_parallel_size=2,
                                pp_layer_partition="1,2")


def test_random_sampling_keeps_stages_consistent(tiny_checkpoint) -> None:
    """Each stage's token pool feeds its next step: the sampled request's logprobs match transformers on the
    returned tokens only if the first stage computed with the last stage's samples."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM")
    prompts = random_prompts((12,), seed=4)
    sampled = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=TOP_LOGPROBS,
                             prompt_logprobs=TOP_LOGPROBS)
    outputs = generate(checkpoint, prompts * 2, 1, [GREEDY, sampled], pipeline_parallel_size=2)
    assert logprob_error(prompts * 2, hf_model(checkpoint), outputs) <= LOGPROB_TOLERANCE
    assert outputs[0].token_ids == generate(checkpoint, prompts, 1)[0].token_ids
