"""Tensor parallelism for MoE and MLA models at `tensor_parallel_size=2` against transformers on tiny fp32
checkpoints: 32 greedy tokens equal, prompt and output logprobs within LOGPROB_TOLERANCE.

Every expert is split by its intermediate size and the block all-reduces once (routed plus shared experts);
DeepSeek's MLA splits its heads (q_b_proj / kv_b_proj rows, o_proj columns) and replicates the latent
projections. Qwen2-MoE has a gated shared expert and a dense middle layer; DeepSeek-V3 a query LoRA, grouped
sigmoid routing and shared experts (its MoE layers start at layer 1 here). Mixtral, Qwen3-MoE and DeepSeek-V2
are marked slow (one engine start each, ~20 s on 2 cores).
"""

from __future__ import annotations

import pytest

from tests.distributed.golden import LOGPROB_TOLERANCE, NEW_TOKENS, generate, logprob_error, random_prompts
from tests.hf_reference import hf_greedy, hf_model

DEEPSEEK_MOE = {"first_k_dense_replace": 1, "n_shared_experts": 1}


@pytest.mark.parametrize(("architecture", "overrides"), [
    pytest.param("Qwen2MoeForCausalLM", {}, id="qwen2-moe-shared-expert"),
    pytest.param("DeepseekV3ForCausalLM", DEEPSEEK_MOE, id="deepseek-v3-mla-moe"),
    pytest.param("MixtralForCausalLM", {}, id="mixtral", marks=pytest.mark.slow),
    pytest.param("Qwen3MoeForCausalLM", {}, id="qwen3-moe", marks=pytest.mark.slow),
    pytest.param("DeepseekV2ForCausalLM", DEEPSEEK_MOE, id="deepseek-v2-mla-moe", marks=pytest.mark.slow),
])
def test_tp2_moe_and_mla_match_transformers(tiny_checkpoint, architecture: str, overrides: dict) -> None:
    checkpoint = tiny_checkpoint(architecture, **overrides)
    prompts = random_prompts((6, 21), seed=9)
    hf = hf_model(checkpoint)
    outputs = generate(checkpoint, prompts, 2)
    assert [output.token_ids for output in outputs] == hf_greedy(hf, prompts, NEW_TOKENS)
    error = logprob_error(prompts, hf, outputs)
    print(f"{architecture}: max logprob difference {error:.2e}")
    assert error <= LOGPROB_TOLERANCE
