"""Decode context parallelism on CPU gloo ranks: with `--tp 2 --dcp 2` both ranks hold the model's one KV head
and each stores every other token of every sequence (ops/attention/dcp_backend.py); attention merges the two
partial results by their log-sum-exps. Greedy tokens and logprobs equal transformers' (within 1e-4) on Llama and
Qwen3-MoE (one KV head) and DeepSeek-V3 (MLA's latent, ops/attention/dcp_mla_backend.py) with chunked prefill, prefix caching and async scheduling; a context longer than one rank's KV cache is
served at DCP=2 and refused at start at DCP=1."""

from __future__ import annotations

import pytest

from rapid_llm import LLM, SamplingParams
from rapid_llm.server_args import ServerArgs
from tests.distributed.golden import assert_matches_transformers, random_prompts
from tests.hf_reference import hf_greedy, hf_model


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"])
def test_dcp2_matches_transformers(tiny_checkpoint, architecture: str) -> None:
    # MLA's latent is shared by every head: any model splits; the others need one KV head per DCP group.
    mla = architecture == "DeepseekV3ForCausalLM"
    checkpoint = tiny_checkpoint(architecture) if mla else tiny_checkpoint(architecture, num_key_value_heads=1)
    assert_matches_transformers(checkpoint, 2, f"{architecture} tp=2 dcp=2", decode_context_parallel_size=2,
                                max_num_batched_tokens=16, block_size=4)


def test_a_context_longer_than_one_ranks_cache_is_served_at_dcp2(tiny_checkpoint) -> None:
    """8 blocks of 4 tokens per rank: 32 tokens at DCP=1 (refused for a 48-token context), 64 at DCP=2."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM", num_key_value_heads=1)
    engine = {"model": str(checkpoint), "tensor_parallel_size": 2, "num_kv_blocks": 8, "block_size": 4,
              "max_model_len": 48}
    with pytest.raises(RuntimeError, match="KV cache holds 32 tokens, fewer than max_model_len"):
        LLM(**engine, decode_context_parallel_size=1)
    prompt = random_prompts((40,), seed=2)
    with LLM(**engine, decode_context_parallel_size=2) as llm:
        output = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8))[0]
    assert output.token_ids == hf_greedy(hf_model(checkpoint), prompt, 8)[0]


def test_layouts_dcp_cannot_serve_are_refused(tiny_checkpoint) -> None:
    llama = str(tiny_checkpoint("LlamaForCausalLM", num_key_value_heads=2))
    lfm2 = str(tiny_checkpoint("Lfm2ForCausalLM"))
    for model, args, message in [(llama, {"tensor_parallel_size": 2}, "one KV head replicated"),
                                 (llama, {"tensor_parallel_size": 3}, "divide --tensor-parallel-size 3"),
                                 (lfm2, {"tensor_parallel_size": 2}, "Lfm2ForCausalLM is not served"),
                                 (llama, {"tensor_parallel_size": 4, "kv_cache_dtype": "fp8"}, "--kv-cache-dtype")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model=model, decode_context_parallel_size=2, **args).engine_config(model)


def test_prefix_hits_and_preemption_keep_tokens(tiny_checkpoint, capfd) -> None:
    """Four requests twice (the second round over cached blocks) in a cache too small for all four at once."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM", num_key_value_heads=1)
    prompts = random_prompts((30, 34, 27, 31), seed=8)
    expected = hf_greedy(hf_model(checkpoint), prompts, 16)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=16)
    with LLM(model=str(checkpoint), tensor_parallel_size=2, decode_context_parallel_size=2, num_kv_blocks=14,
             block_size=4, max_model_len=64, max_num_batched_tokens=16, log_level="info") as llm:
        for _ in range(2):
            assert [output.token_ids for output in llm.generate(prompts, greedy)] == expected
        cached = llm.generate(prompts[-1:], greedy)[0].num_cached_tokens  # the last one in: still cached
    assert cached > 0 and "preempt" in capfd.readouterr().err
