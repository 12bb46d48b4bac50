"""PEFT adapter folders read without torch and checked against the served model's LoRA-capable modules
(lora/adapter_files.py), the multi-LoRA flags (config/lora_config.py, server_args), and the modules a worker
wraps (lora/adapter_slots.py): dense projections of every layer, the embedding and the LM head, never MoE experts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rapid_llm.config import ModelConfig
from rapid_llm.config.lora_config import LoRAConfig
from rapid_llm.layers.step_rows import StepRows
from rapid_llm.lora.adapter_files import AdapterError, check_adapter, read_adapter
from rapid_llm.lora.adapter_slots import AdapterSlots
from rapid_llm.model_loader.loader import load_model
from rapid_llm.server_args import ServerArgs

Q = "model.layers.0.self_attn.q_proj"
TARGETS = {Q: (64, 64), "model.layers.0.mlp.down_proj": (128, 64)}


def write_adapter(folder: Path, config: dict | None = None, tensors: dict | None = None, rank: int = 4) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    base = {"peft_type": "LORA", "r": rank, "lora_alpha": 8, "target_modules": ["q_proj"], "bias": "none"}
    (folder / "adapter_config.json").write_text(json.dumps({**base, **(config or {})}))
    default = {f"base_model.model.{Q}.lora_A.weight": torch.zeros(rank, 64),
               f"base_model.model.{Q}.lora_B.weight": torch.zeros(64, rank)}
    save_file(default if tensors is None else tensors, folder / "adapter_model.safetensors")
    return str(folder)


def test_a_plain_adapter_reads_its_rank_scaling_and_shapes(tmp_path) -> None:
    adapter = read_adapter(write_adapter(tmp_path / "a"))
    assert (adapter.rank, adapter.scaling, adapter.modules) == (4, 2.0, {Q: ((4, 64), (64, 4))})
    check_adapter(adapter, TARGETS, max_rank=4)
    rslora = read_adapter(write_adapter(tmp_path / "b", {"use_rslora": True}))
    assert rslora.scaling == pytest.approx(8 / math.sqrt(4))


@pytest.mark.parametrize(("config", "cause"), [
    ({"use_dora": True}, "DoRA"), ({"bias": "lora_only"}, "biases"), ({"modules_to_save": ["lm_head"]}, "lm_head"),
    ({"rank_pattern": {"q_proj": 8}}, "per-module ranks"), ({"fan_in_fan_out": True}, "Conv1D"),
    ({"peft_type": "IA3"}, "IA3"), ({"r": 0}, "r must be a positive integer")])
def test_configs_that_change_the_math_are_refused(tmp_path, config, cause) -> None:
    with pytest.raises(AdapterError, match=cause):
        read_adapter(write_adapter(tmp_path, config))


def test_tensors_and_shapes_the_model_cannot_take_are_refused(tmp_path) -> None:
    with pytest.raises(AdapterError, match="not a LoRA A/B matrix"):
        read_adapter(write_adapter(tmp_path / "dora", tensors={f"base_model.model.{Q}.lora_magnitude_vector":
                                                              torch.zeros(64)}))
    with pytest.raises(AdapterError, match=r"only \['A'\]"):
        half = {f"base_model.model.{Q}.lora_A.weight": torch.zeros(4, 64)}
        read_adapter(write_adapter(tmp_path / "half", tensors=half))
    with pytest.raises(AdapterError, match="do not have rank"):
        read_adapter(write_adapter(tmp_path / "rank", rank=8, tensors={
            f"base_model.model.{Q}.lora_A.weight": torch.zeros(4, 64),
            f"base_model.model.{Q}.lora_B.weight": torch.zeros(64, 4)}))
    adapter = read_adapter(write_adapter(tmp_path / "ok"))
    with pytest.raises(AdapterError, match="above --max-lora-rank 2"):
        check_adapter(adapter, TARGETS, max_rank=2)
    with pytest.raises(AdapterError, match="another base model"):
        check_adapter(adapter, {Q: (96, 64)}, max_rank=8)
    with pytest.raises(AdapterError, match=f"targets module '{Q}'"):
        check_adapter(adapter, {}, max_rank=8)
    with pytest.raises(AdapterError, match="not a PEFT adapter folder"):
        read_adapter(str(tmp_path))


def test_embedding_and_lm_head_adapters_read_as_linears(tmp_path) -> None:
    """PEFT's lora_embedding_A/B and the base_layer copies it saves beside them (checked by shape, not kept)."""
    embed, head = "model.embed_tokens", "lm_head"
    tensors = {f"base_model.model.{embed}.lora_embedding_A": torch.zeros(4, 100),
               f"base_model.model.{embed}.lora_embedding_B": torch.zeros(64, 4),
               f"base_model.model.{embed}.base_layer.weight": torch.zeros(100, 64),
               f"base_model.model.{head}.lora_A.weight": torch.zeros(4, 64),
               f"base_model.model.{head}.lora_B.weight": torch.zeros(100, 4),
               f"base_model.model.{head}.base_layer.weight": torch.zeros(100, 64)}
    adapter = read_adapter(write_adapter(tmp_path / "vocab", tensors=tensors))
    assert adapter.modules == {embed: ((4, 100), (64, 4)), head: ((4, 64), (100, 4))}
    check_adapter(adapter, {embed: (100, 64), head: (64, 100)}, max_rank=4)
    with pytest.raises(AdapterError, match="another base model"):
        check_adapter(adapter, {embed: (120, 64), head: (64, 120)}, max_rank=4)
    tensors[f"base_model.model.{head}.base_layer.weight"] = torch.zeros(64, 100)
    with pytest.raises(AdapterError, match=r"imply \[100, 64\]"):
        read_adapter(write_adapter(tmp_path / "transposed", tensors=tensors))


def test_flags_are_checked_at_start(tiny_checkpoint) -> None:
    config = LoRAConfig.parse(["sql=/adapters/sql"], max_loras=2)
    assert (config.max_cpu_loras, config.modules[0].name, config.modules[0].path) == (2, "sql", "/adapters/sql")
    for kwargs, message in [({"max_loras": 0}, "--max-loras"), ({"max_lora_rank": 1024}, "--max-lora-rank"),
                            ({"max_loras": 4, "max_cpu_loras": 2}, "--max-cpu-loras"),
                            ({"modules": ["no-path"]}, "NAME=PATH"), ({"modules": ["a=/x", "a=/y"]}, "twice"),
                            ({"allowed_dirs": ["/no/such/dir"]}, "--lora-allowed-dirs")]:
        with pytest.raises(ValueError, match=message):
            LoRAConfig.parse(**kwargs)
    checkpoint = str(tiny_checkpoint("LlamaForCausalLM"))
    spec = '{"method": "ngram", "num_speculative_tokens": 2}'
    for args, message in [({"enable_lora": True, "speculative_config": spec}, "--speculative-config"),
                          ({"lora_modules": ["a=/x"]}, "with --enable-lora only")]:
        with pytest.raises(ValueError, match=message):
            ServerArgs(model=checkpoint, **args).engine_config(checkpoint)
    assert ServerArgs(model=checkpoint).engine_config(checkpoint).scheduler.lora is None


def test_moe_experts_take_no_adapter(tiny_checkpoint, tmp_path) -> None:
    """Qwen3-MoE: attention projections are wrapped; experts are fused tensors, so an adapter on them is refused."""
    model_config = ModelConfig.from_pretrained(str(tiny_checkpoint("Qwen3MoeForCausalLM")))
    model = load_model(model_config, torch.device("cpu"))
    slots = AdapterSlots(model, LoRAConfig(max_loras=1), StepRows(2, torch.device("cpu")), torch.float32,
                         torch.device("cpu"))
    assert {"model.layers.0.self_attn.q_proj", "model.embed_tokens", "lm_head"} <= set(slots.targets)
    assert not any("experts" in name for name in slots.targets)
    expert = "base_model.model.model.layers.0.mlp.experts.0.gate_proj"
    folder = write_adapter(tmp_path, tensors={f"{expert}.lora_A.weight": torch.zeros(4, 8),
                                              f"{expert}.lora_B.weight": torch.zeros(8, 4)})
    with pytest.raises(AdapterError, match="MoE experts"):
        check_adapter(read_adapter(folder), slots.targets, max_rank=8)
