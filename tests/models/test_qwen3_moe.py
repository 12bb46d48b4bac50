"""Qwen3-MoE beyond the shared parity matrix (test_hf_parity covers the default tiny config): routing
and layer-placement variants, the expert weight mapping, the CPU weight-dtype rule and the tensor-parallel expert slice."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from rapid_llm.config import ModelConfig
from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.model_loader import load_model
from rapid_llm.models.weight_mapping import (
    LLAMA_STACKED_PARAMS,
    checkpoint_name_of,
    expected_shards,
    expert_stacked_params,
    map_checkpoint_name,
)
from tests.models.moe_parity import assert_matches_transformers

ARCH = "Qwen3MoeForCausalLM"
STACKED = expert_stacked_params(4) + LLAMA_STACKED_PARAMS


@pytest.mark.parametrize("overrides", [{"norm_topk_prob": False, "mlp_only_layers": [], "decoder_sparse_step": 2},
                                       {"num_experts_per_tok": 3, "mlp_only_layers": [0]}])
def test_routing_and_layer_variants_match_transformers(tiny_checkpoint, overrides: dict) -> None:
    assert_matches_transformers(tiny_checkpoint(ARCH, **overrides))


@pytest.mark.parametrize(
    "checkpoint_name,param_name,shard_id",
    [
        ("model.layers.2.mlp.experts.3.gate_proj.weight", "model.layers.2.mlp.experts.w13_weight", (3, "gate")),
        ("model.layers.2.mlp.experts.0.up_proj.weight", "model.layers.2.mlp.experts.w13_weight", (0, "up")),
        ("model.layers.0.mlp.experts.1.down_proj.weight", "model.layers.0.mlp.experts.w2_weight", (1, "down")),
        ("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.gate_up_proj.weight", 0),
        ("model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate.weight", None),
    ],
)
def test_expert_checkpoint_names_map_to_stacked_experts(checkpoint_name: str, param_name: str, shard_id) -> None:
    assert map_checkpoint_name(checkpoint_name, STACKED) == (param_name, shard_id)
    assert checkpoint_name_of(param_name, shard_id, STACKED) == checkpoint_name


def test_stacked_experts_expect_every_expert() -> None:
    assert expected_shards("model.layers.0.mlp.experts.w2_weight", STACKED) == {(e, "down") for e in range(4)}
    assert len(expected_shards("model.layers.0.mlp.experts.w13_weight", STACKED)) == 8
    assert expected_shards("model.layers.0.mlp.gate.weight", STACKED) == {None}


def test_a_missing_expert_matrix_is_named(tiny_checkpoint, tmp_path) -> None:
    source = tiny_checkpoint(ARCH)
    tensors = load_file(source / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.3.up_proj.weight"]
    for name in ("config.json", "generation_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks weights the model needs: model\.layers\.2\.mlp\.experts\.3\.up_proj"):
        load_model(ModelConfig.from_pretrained(str(tmp_path)), torch.device("cpu"))


def test_tensor_parallel_experts_hold_their_slice_of_the_intermediate_size(monkeypatch) -> None:
    """Rank 1 of 2: gate and up rows 4..7 of each expert (stacked gate then up), down columns 4..7."""
    monkeypatch.setattr("rapid_llm.layers.moe.experts.get_tp_size", lambda: 2)
    monkeypatch.setattr("rapid_llm.layers.moe.experts.get_tp_rank", lambda: 1)
    experts = FusedExperts(4, 16, 8)
    gate, up, down = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 8)
    for shard, tensor in (("gate", gate), ("up", up)):
        experts.weight_loader(experts.w13_weight, tensor, (2, shard))
    experts.weight_loader(experts.w2_weight, down, (2, "down"))
    assert torch.equal(experts.w13_weight[2], torch.cat((gate[4:], up[4:])))
    assert torch.equal(experts.w2_weight[2], down[:, 4:])
