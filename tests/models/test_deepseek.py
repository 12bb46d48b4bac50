"""DeepSeek-V2/V3 (MLA) beyond the shared parity matrix (test_hf_parity runs the default tiny configs, which are
all dense so MLA is checked alone): the query LoRA and rope variants, YaRN's mscale, MoE layers with each
router, the latent cache, prefix-cache sharing of latent blocks and the expanded reference backend."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.mla_attention import MLAAttention
from rapid_llm.ops.attention.mla_absorbed import MLA_ABSORBED_BACKEND
from rapid_llm.ops.attention.mla_torch_ref import MLA_TORCH_REF_BACKEND
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_greedy, hf_logits, hf_model
from tests.models.moe_parity import assert_prefix_hit_matches, assert_unassigned_blocks_never_leak
from tests.models.paged_generation import generate, prefill_logits
from tests.models.test_hf_parity import NEW_TOKENS, _prompts, _runner

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}
# MoE from the second of three layers: a dense layer, then DeepSeek's sparse block (routed + shared experts).
MOE = {"num_hidden_layers": 3, "first_k_dense_replace": 1}
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)


@pytest.mark.parametrize(("architecture", "overrides"), [
    (V2, {"q_lora_rank": 40}),
    (V3, {"rope_interleave": False}),
    (V3, {"rope_parameters": YARN}),
    (V2, {"rope_parameters": YARN, "attention_bias": True}),
    (V3, {"num_hidden_layers": 3, "first_k_dense_replace": 3}),
    (V2, MOE),
    (V2, {**MOE, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5}),
    (V3, MOE),
    (V3, {**MOE, "norm_topk_prob": False, "routed_scaling_factor": 2.5, "n_shared_experts": 2}),
], ids=["v2-q-lora", "v3-neox-rope", "v3-yarn-mscale", "v2-yarn-bias", "v3-three-layers", "v2-moe-greedy",
        "v2-moe-group-limited", "v3-moe-noaux-tc", "v3-moe-unnormalised"])
def test_variants_match_transformers(tiny_checkpoint, architecture: str, overrides: dict) -> None:
    checkpoint = tiny_checkpoint(architecture, **overrides)
    runner = _runner(checkpoint, block_size=5)
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=(9, 23, 40), seed=5)
    for ours, prompt in zip(prefill_logits(runner, prompts), prompts):
        assert (ours - hf_logits(hf, prompt)).abs().max().item() <= 1e-3
    # Chunks of 8 over blocks of 5, arrivals staggered so prefill chunks share steps with decodes.
    sequences = generate(runner, prompts, GREEDY, chunk_size=8, stagger=2)
    assert [s.output for s in sequences] == hf_greedy(hf, prompts, NEW_TOKENS)
    assert len({token for s in sequences for token in s.output}) > 5, "degenerate test: outputs barely vary"


def test_layers_cache_one_latent_per_token(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint(V3)
    config = ModelConfig.from_pretrained(str(checkpoint))
    budget = 1 << 20
    runner = ModelRunner(config, CacheConfig(block_size=16, kv_cache_memory_bytes=budget), DeviceConfig("cpu"))
    hf_config = config.hf_config
    latent_dim = hf_config.kv_lora_rank + hf_config.qk_rope_head_dim
    assert runner.backend is MLA_ABSORBED_BACKEND  # the default; decodes attend over the latents
    assert all(isinstance(layer, MLAAttention) for layer in runner.kv_cache.layers)
    assert len(runner.kv_cache.layers) == hf_config.num_hidden_layers
    bytes_per_block = hf_config.num_hidden_layers * 16 * latent_dim * 4
    assert runner.kv_cache.num_blocks == budget // bytes_per_block
    assert runner.num_blocks == runner.kv_cache.num_blocks - 1  # the last one is the padding block
    assert runner.kv_cache.num_tokens == runner.kv_cache.num_blocks * 16
    assert all(layer.kv_cache.shape == (runner.kv_cache.num_blocks, 16, latent_dim)
               for layer in runner.kv_cache.layers)


def test_garbage_in_unassigned_latent_blocks_never_leaks(tiny_checkpoint) -> None:
    assert_unassigned_blocks_never_leak(tiny_checkpoint(V2))


def test_a_request_reuses_another_requests_latent_blocks(tiny_checkpoint) -> None:
    """The second request never computes its first 16 tokens: its attention must read them from the
    first request's latent blocks, as a prefix-cache hit does."""
    assert_prefix_hit_matches(tiny_checkpoint(V3), block_size=4, shared_blocks=4)


def test_the_expanded_reference_backend_matches_too(tiny_checkpoint) -> None:
    """The default backend absorbs kv_b_proj for decodes; pinned torch_ref expands every history."""
    checkpoint = tiny_checkpoint(V2)
    runner = ModelRunner(ModelConfig.from_pretrained(str(checkpoint)), CacheConfig(block_size=5, num_blocks=64),
                         DeviceConfig("cpu"), op_backends={"mla_attention": "torch_ref"})
    assert runner.backend is MLA_TORCH_REF_BACKEND
    hf = hf_model(checkpoint, torch.float32)
    prompts = _prompts(runner.model_config.vocab_size, lengths=(9, 23), seed=7)
    assert [s.output for s in generate(runner, prompts, GREEDY, chunk_size=8, stagger=2)] == hf_greedy(
        hf, prompts, NEW_TOKENS)
