"""Mixtral beyond the shared parity matrix (test_hf_parity covers the default tiny config, no sliding
window): a sliding window, top-1 and top-3 routing, and its checkpoint names (block_sparse_moe, w1/w3/w2)."""

from __future__ import annotations

import pytest

from rapid_llm.models.mixtral import MixtralForCausalLM
from rapid_llm.models.weight_mapping import checkpoint_name_of, expected_shards, map_checkpoint_name
from rapid_llm.utils.tiny_checkpoint import tiny_config
from tests.models.moe_parity import assert_matches_transformers

ARCH = "MixtralForCausalLM"


@pytest.mark.parametrize("overrides", [{"sliding_window": 8}, {"num_experts_per_tok": 1}, {"num_experts_per_tok": 3}])
def test_variants_match_transformers(tiny_checkpoint, overrides: dict) -> None:
    assert_matches_transformers(tiny_checkpoint(ARCH, **overrides))


def _stacked() -> tuple:
    return MixtralForCausalLM(tiny_config(ARCH)).stacked_params


@pytest.mark.parametrize(
    "checkpoint_name,param_name,shard_id",
    [
        ("model.layers.1.block_sparse_moe.experts.3.w1.weight", "model.layers.1.mlp.experts.w13_weight", (3, "gate")),
        ("model.layers.1.block_sparse_moe.experts.0.w3.weight", "model.layers.1.mlp.experts.w13_weight", (0, "up")),
        ("model.layers.0.block_sparse_moe.experts.2.w2.weight", "model.layers.0.mlp.experts.w2_weight", (2, "down")),
        ("model.layers.0.block_sparse_moe.gate.weight", "model.layers.0.mlp.gate.weight", None),
        ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.qkv_proj.weight", "k"),
    ],
)
def test_mixtral_checkpoint_names_map_to_the_moe_block(checkpoint_name: str, param_name: str, shard_id) -> None:
    stacked = _stacked()
    assert map_checkpoint_name(checkpoint_name, stacked) == (param_name, shard_id)
    assert checkpoint_name_of(param_name, shard_id, stacked) == checkpoint_name


def test_mixtral_experts_expect_every_expert() -> None:
    stacked = _stacked()
    assert expected_shards("model.layers.0.mlp.experts.w2_weight", stacked) == {(e, "down") for e in range(4)}
    assert expected_shards("model.layers.0.mlp.gate.weight", stacked) == {None}
