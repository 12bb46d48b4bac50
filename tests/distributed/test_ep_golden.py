"""Expert parallelism end to end on CPU (gloo): `LLM(..., tensor_parallel_size=2, enable_expert_parallel=True)`
partitions the experts over the two ranks (attention stays tensor-parallel) and gives the greedy tokens of one
rank, with logprobs within LOGPROB_TOLERANCE of transformers.

Qwen2-MoE (4 experts, 2 per rank, plus a gated shared expert split by TP) runs by default; DeepSeek-V3 (MLA,
grouped sigmoid routing, shared experts), Mixtral and Qwen3-MoE are marked slow (~25 s each: two engine starts).
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
])
def test_ep2_greedy_tokens_equal_one_rank(tiny_checkpoint, architecture: str, overrides: dict) -> None:
    checkpoint = tiny_checkpoint(architecture, **overrides)
    outputs = assert_matches_transformers(checkpoint, 2, f"{architecture} EP=2", enable_expert_parallel=True)
    single = generate(checkpoint, random_prompts((6, 21), seed=9), 1)
    assert [output.token_ids for output in outputs] == [output.token_ids for output in single]
