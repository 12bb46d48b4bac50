"""DeepSeek-V4 against transformers on tiny random checkpoints: four layers cover sliding, CSA (compressor +
Lightning Indexer, rate 4) and HCA (rate 8) attention and both hash_moe and moe MLPs (tiny_checkpoint's V4
defaults: window 8, index_topk 3, so windows slide and the indexer drops entries within the prompts). Prefill
logits, greedy generation with chunked prefill and staggered arrivals, prefix-cache hits that end inside a
compression window, the per-token cache rows, and the refusal of DeepSeek-V4.1's config."""

from __future__ import annotations

import json

import pytest

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.dsv4_attention import DeepseekV4AttentionCore
from rapid_llm.ops.attention.kv_cache_spec import DeepseekV4Spec
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.moe_parity import (
    assert_matches_transformers,
    assert_prefix_hit_matches,
    assert_unassigned_blocks_never_leak,
)

V4 = "DeepseekV4ForCausalLM"


@pytest.mark.parametrize("overrides", [
    {},
    {"scoring_func": "sigmoid", "rope_parameters": None, "hc_mult": 3, "o_groups": 4, "swiglu_limit": 10.0},
], ids=["sqrtsoftplus-yarn", "sigmoid-default-rope"])
def test_matches_transformers(tiny_checkpoint, overrides: dict) -> None:
    """fp32 prefill logits within 1e-3 (mixed lengths in one step) and 32 greedy tokens equal, chunked by 8
    over blocks of 5 with staggered arrivals, so decodes close compression windows step by step."""
    max_diff = assert_matches_transformers(tiny_checkpoint(V4, **overrides), lengths=(9, 23, 40))
    print(f"DeepSeek-V4 {overrides or 'default'}: max |logit diff| {max_diff:.2e}")


def test_prefix_cache_hit_inside_a_compression_window(tiny_checkpoint) -> None:
    """The second request reuses the first's three blocks of 5 (15 tokens): the CSA window 12..15 and the HCA
    window 8..15 it closes at token 15 pool raw rows from the shared blocks with its own token's row."""
    assert_prefix_hit_matches(tiny_checkpoint(V4), block_size=5, shared_blocks=3)


def test_garbage_in_unassigned_blocks_never_leaks(tiny_checkpoint) -> None:
    assert_unassigned_blocks_never_leak(tiny_checkpoint(V4))


def test_each_layer_caches_one_row_per_token(tiny_checkpoint) -> None:
    """Sliding: the K=V row (32). HCA: + entry and raw kv/gate (32 * 3). CSA: + two series of raw kv/gate for the
    compressor (32 * 5) and the indexer (16 * 5)."""
    config = ModelConfig.from_pretrained(str(tiny_checkpoint(V4)))
    budget = 1 << 20
    runner = ModelRunner(config, CacheConfig(block_size=16, kv_cache_memory_bytes=budget), DeviceConfig("cpu"))
    assert all(isinstance(layer, DeepseekV4AttentionCore) for layer in runner.kv_cache.layers)
    specs = runner.kv_cache.specs
    assert all(isinstance(spec, DeepseekV4Spec) for spec in specs)
    assert [spec.elements_per_token for spec in specs] == [32, 32 + 32 * 5 + 16 * 5, 32 + 32 * 3, 32 + 32 * 5 + 16 * 5]
    assert runner.kv_cache.num_blocks == budget // (16 * 4 * sum(spec.elements_per_token for spec in specs))
    assert runner.num_blocks == runner.kv_cache.num_blocks - 1  # the last one is the padding block
    assert all(layer.kv_cache.shape == (runner.kv_cache.num_blocks, 16, spec.elements_per_token)
               for layer, spec in zip(runner.kv_cache.layers, specs))


def test_deepseek_v41_is_refused_with_what_is_missing(tmp_path) -> None:
    config = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
              "text_config": {"vocab_size": 512, "compress_ratios": [0, 0, 2, 1]}, "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="DeepSeek-V4.1 .* not supported: .*kv_source_layer_ids.*engram"):
        ModelConfig.from_pretrained(str(tmp_path))
