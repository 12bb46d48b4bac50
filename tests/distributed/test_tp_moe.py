"""Tensor parallelism for MoE and MLA models at `tensor_parallel_size=2` against transformers on tiny fp32
checkpoints: 32 greedy tokens equal, prompt and output logprobs within LOGPROB_TOLERANCE.

Every expert is split by its intermediate size and the block all-reduces once (routed plus shared experts);
DeepSeek's MLA splits its heads (q_b_proj / kv_b_proj rows, o_proj columns) and replicates the latent
projections. Qwen2-MoE has a gated shared expert and a dense middle layer; DeepSeek-V3 a query LoRA, grouped
sigmoid routing and shared experts (its MoE layers start at layer 1 here). Only DeepSeek-V3 runs by default
(one engine start each, ~20 s on 2 cores); Qwen2-MoE, Mixtral, Qwen3-MoE and DeepSeek-V2 are marked slow.
"""

from __future__ import annotations

import pytest

from tests.distributed.golden import assert_matches_transformers

DEEPSEEK_MOE = {"first_k_dense_replace": 1, "n_shared_experts": 1}


@pytest.mark.parametrize(("architecture", "overrides"), [
    pytest.param("Qwen2MoeForCausalLM", {}, id="qwen2-moe-shared-expert", marks=pytest.mark.slow),
    pytest.param("DeepseekV3ForCausalLM", DEEPSEEK_MOE, id="deepseek-v3-mla-moe"),
    pytest.param("MixtralForCausalLM", {}, id="mixtral", marks=pytest.mark.slow),
    pytest.param("Qwen3MoeForCausalLM", {}, id="qwen3-moe", marks=pytest.mark.slow),
    pytest.param("DeepseekV2ForCausalLM", DEEPSEEK_MOE, id="deepseek-v2-mla-moe", marks=pytest.mark.slow),
])
def test_tp2_moe_and_mla_match_transformers(tiny_checkpoint, architecture: str, overrides: dict) -> None:
    assert_matches_transformers(tiny_checkpoint(architecture, **overrides), 2, architecture)
