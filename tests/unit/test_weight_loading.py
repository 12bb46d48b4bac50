"""Checkpoint-name mapping, sharded loading, and errors that name missing or unexpected weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rapid_llm.config import ModelConfig
from rapid_llm.model_loader import load_model
from rapid_llm.models.weight_mapping import (
    LLAMA_STACKED_PARAMS,
    checkpoint_name_of,
    expected_shards,
    map_checkpoint_name,
)
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint


@pytest.mark.parametrize(
    "checkpoint_name,param_name,shard_id",
    [
        ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.qkv_proj.weight", "q"),
        ("model.layers.3.self_attn.k_proj.bias", "model.layers.3.self_attn.qkv_proj.bias", "k"),
        ("model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.qkv_proj.weight", "v"),
        ("model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.gate_up_proj.weight", 0),
        ("model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.gate_up_proj.weight", 1),
        ("model.layers.1.self_attn.o_proj.weight", "model.layers.1.self_attn.o_proj.weight", None),
        ("model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.q_norm.weight", None),
        ("model.embed_tokens.weight", "model.embed_tokens.weight", None),
    ],
)
def test_checkpoint_names_map_to_stacked_parameters(checkpoint_name: str, param_name: str, shard_id) -> None:
    assert map_checkpoint_name(checkpoint_name, LLAMA_STACKED_PARAMS) == (param_name, shard_id)
    assert checkpoint_name_of(param_name, shard_id, LLAMA_STACKED_PARAMS) == checkpoint_name


def test_stacked_parameters_expect_every_shard() -> None:
    assert expected_shards("model.layers.0.self_attn.qkv_proj.weight", LLAMA_STACKED_PARAMS) == {"q", "k", "v"}
    assert expected_shards("model.layers.0.mlp.gate_up_proj.weight", LLAMA_STACKED_PARAMS) == {0, 1}
    assert expected_shards("model.norm.weight", LLAMA_STACKED_PARAMS) == {None}


def _copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_sharded_checkpoint_loads_the_same_weights(tmp_path: Path) -> None:
    single = build_tiny_checkpoint(tmp_path / "single", "Qwen2ForCausalLM", with_tokenizer=False)
    sharded = build_tiny_checkpoint(tmp_path / "sharded", "Qwen2ForCausalLM", with_tokenizer=False,
                                    max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    first = load_model(ModelConfig.from_pretrained(str(single)), torch.device("cpu"))
    second = load_model(ModelConfig.from_pretrained(str(sharded)), torch.device("cpu"))
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name


def test_weights_are_cast_to_the_requested_dtype(tiny_checkpoint) -> None:
    model = load_model(ModelConfig.from_pretrained(str(tiny_checkpoint()), dtype="bfloat16"), torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_weight_is_named(tiny_checkpoint, tmp_path: Path) -> None:
    checkpoint = _copy_checkpoint(tiny_checkpoint(), tmp_path / "ckpt")
    tensors = load_file(checkpoint / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    del tensors["model.layers.0.post_attention_layernorm.weight"]
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as error:
        load_model(ModelConfig.from_pretrained(str(checkpoint)), torch.device("cpu"))
    assert "lacks weights" in str(error.value)
    assert "model.layers.1.self_attn.k_proj.weight" in str(error.value)
    assert "model.layers.0.post_attention_layernorm.weight" in str(error.value)


def test_unexpected_weight_is_named(tiny_checkpoint, tmp_path: Path) -> None:
    checkpoint = _copy_checkpoint(tiny_checkpoint(), tmp_path / "ckpt")
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="does not use: model.layers.0.mlp.extra_proj.weight"):
        load_model(ModelConfig.from_pretrained(str(checkpoint)), torch.device("cpu"))


def test_wrong_shape_is_named(tiny_checkpoint, tmp_path: Path) -> None:
    checkpoint = _copy_checkpoint(tiny_checkpoint(), tmp_path / "ckpt")
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="'model.norm.weight'.*shape"):
        load_model(ModelConfig.from_pretrained(str(checkpoint)), torch.device("cpu"))


def test_tied_embeddings_share_one_tensor(tiny_checkpoint) -> None:
    model = load_model(ModelConfig.from_pretrained(str(tiny_checkpoint(tie_word_embeddings=True))),
                       torch.device("cpu"))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
