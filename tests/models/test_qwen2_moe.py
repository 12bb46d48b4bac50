"""Qwen2-MoE beyond the shared parity matrix (test_hf_parity covers the default tiny config: a dense
middle layer, norm_topk_prob False, q/k/v bias): renormalised and top-3 routing, decoder_sparse_step,
no qkv bias, and the shared expert's checkpoint names."""

from __future__ import annotations

import pytest

from rapid_llm.models.weight_mapping import LLAMA_STACKED_PARAMS, expert_stacked_params, map_checkpoint_name
from tests.models.moe_parity import assert_matches_transformers

ARCH = "Qwen2MoeForCausalLM"


@pytest.mark.parametrize("overrides", [{"norm_topk_prob": True, "num_experts_per_tok": 3},
                                       {"decoder_sparse_step": 2, "mlp_only_layers": [], "qkv_bias": False}])
def test_variants_match_transformers(tiny_checkpoint, overrides: dict) -> None:
    assert_matches_transformers(tiny_checkpoint(ARCH, **overrides))


@pytest.mark.parametrize(
    "checkpoint_name,param_name,shard_id",
    [
        ("model.layers.0.mlp.shared_expert.gate_proj.weight", "model.layers.0.mlp.shared_expert.gate_up_proj.weight", 0),
        ("model.layers.0.mlp.shared_expert.down_proj.weight", "model.layers.0.mlp.shared_expert.down_proj.weight", None),
        ("model.layers.0.mlp.shared_expert_gate.weight", "model.layers.0.mlp.shared_expert_gate.weight", None),
        ("model.layers.2.mlp.experts.1.up_proj.weight", "model.layers.2.mlp.experts.w13_weight", (1, "up")),
    ],
)
def test_shared_expert_names_map_to_the_gated_mlp(checkpoint_name: str, param_name: str, shard_id) -> None:
    assert map_checkpoint_name(checkpoint_name, expert_stacked_params(4) + LLAMA_STACKED_PARAMS) == (param_name,
                                                                                                       shard_id)
