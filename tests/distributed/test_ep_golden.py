"""Expert parallelism end to end on CPU (gloo): `LLM(..., tensor_parallel_size=2, enable_expert_parallel=True)`
partitions the experts over the two ranks (attention stays tensor-parallel) and gives the greedy tokens of one
rank, with logprobs within LOGPROB_TOLERANCE of transformers.

Qwen2-MoE (4 experts, 2 per rank, plus a gated shared expert split by TP) runs by default; DeepSeek-V3 (MLA,
grouped sigmoid routing, shared experts), Mixtral, Qwen3-MoE, DeepSeek-V2 and n-gram speculative decoding under
EP are marked slow (~25 s each: two engine starts).
"""

from __future__ import annotations

import pytest

from tests.distributed.golden import assert_matches_transformers, generate, random_prompts

DEEPSEEK_MOE = {"first_k_dense_replace": 1, "n_shared_experts": 1}


@pytest.mark.parametrize(("architecture", "overrides"), [
    pytest.param("Qwen2MoeForCausalLM", {}, id="qwen2-moe"),
    pytest.param("DeepseekV3ForCausalLM", DEEPSEEK_MOE, id="deepseek-v3", marks=pytest.mark.slow),
    pytest.param("MixtralForCausalLM", {}, id="mixtral", marks=pytest.mark.slow),
    pytest.param("Qwen3MoeForCausalLM", {}, id="qwen3-moe", marks=pytest.mark.slow),
    pytest.param("DeepseekV2ForCausalLM", DEEPSEEK_MOE, id="deepseek-v2", marks=pytest.mark.slow),
])
def test_ep2_greedy_tokens_equal_one_rank(tiny_checkpoint, architecture: str, overrides: dict) -> None:
    checkpoint = tiny_checkpoint(architecture, **overrides)
    outputs = assert_matches_transformers(checkpoint, 2, f"{architecture} EP=2", enable_expert_parallel=True)
    single = generate(checkpoint, random_prompts((6, 21), seed=9), 1)
    assert [output.token_ids for output in outputs] == [output.token_ids for output in single]


@pytest.mark.slow
def test_ep2_speculative_decoding_keeps_greedy_tokens(tiny_checkpoint) -> None:
    """n-gram drafts verified with the experts partitioned: the verify step's pairs move like any others."""
    checkpoint = tiny_checkpoint("Qwen2MoeForCausalLM")
    repetitive = [[5, 6, 7, 8] * 6, [40, 41, 40, 41, 40, 41, 40]]
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    drafted = generate(checkpoint, repetitive, 2, enable_expert_parallel=True, speculative_config=config)
    single = generate(checkpoint, repetitive, 1)
    assert [output.token_ids for output in drafted] == [output.token_ids for output in single]
