"""NVFP4 (ModelOpt layout) and MXFP4 (gpt-oss layout) checkpoints, and online --quantization nvfp4 / mxfp4, give
the logits of the dequantize-then-matmul reference; ignore lists are honoured; malformed configs are refused
naming the field. compressed-tensors layouts: test_compressed_tensors_checkpoints.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.linear import LinearBase
from rapid_llm.quantization.fp4_math import mxfp4_quantize, nvfp4_quantize
from rapid_llm.utils.tiny_checkpoint import SUPPORTED_ARCHITECTURES, build_tiny_checkpoint
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.paged_generation import prefill_logits
from tests.quantization.fp4_reference import (
    add_w4a4_hooks, decode, gpt_oss_mxfp4, modelopt_nvfp4, write_checkpoint,
)
from tests.quantization.fp8_reference import reference_model
from tests.quantization.logit_error import logit_error
from tests.quantization.test_fp8_checkpoints import MERGED, PROMPTS, _write_config

# fp32 everywhere: weight-only formats differ from the reference only in summation order (measured <= 6.7e-6 on
# logits of std ~1.6; a wrong scale or nibble order moves them by ~1).
WEIGHT_ONLY_ATOL = 1e-3
# W4A4 (measured 1.9e-6): a summation-order difference could still move one activation across an fp4 rounding
# step (up to a quarter of its value) or a group scale across an e4m3 step, so the bound leaves room for that.
W4A4_ATOL = 1e-2
MODELOPT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
            "exclude_modules": ["lm_head"]}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn.o_proj", "lm_head"]}


def _runner(checkpoint: Path, quantization: str | None = None) -> ModelRunner:
    config = ModelConfig.from_pretrained(str(checkpoint), quantization=quantization)
    return ModelRunner(config, CacheConfig(block_size=16, num_blocks=16), DeviceConfig("cpu"))


def _max_error(runner: ModelRunner, reference, quantized_activations: bool = True) -> float:
    """See tests/quantization/logit_error.py: with quantized activations, rounding flips of a few tokens pass."""
    return logit_error(runner, reference, PROMPTS, quantized_activations)


def test_modelopt_nvfp4_w4a4_checkpoint_matches_reference(tmp_path: Path) -> None:
    source = build_tiny_checkpoint(tmp_path / "bf16", with_tokenizer=False)
    weights = write_checkpoint(source, tmp_path / "nvfp4", modelopt_nvfp4, MODELOPT, input_scales="input_scale")
    runner = _runner(tmp_path / "nvfp4")
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.uint8 and qkv.weight.shape == (qkv.weight_scale.shape[0], 32)
    assert runner.model.lm_head.weight.dtype == torch.float32
    reference = reference_model(source, weights, None)
    add_w4a4_hooks(reference, weights)
    error = _max_error(runner, reference)
    print(f"modelopt nvfp4 W4A4: max |logit error| {error:.2e}")
    assert error <= W4A4_ATOL


def test_modelopt_config_nested_as_hf_quant_config_writes_it() -> None:
    from rapid_llm.quantization.registry import resolve_quantization

    config = resolve_quantization({"quant_method": "modelopt", "producer": {"name": "modelopt"},
                                   "quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}}, None)
    assert config.summary()["format"] == "nvfp4" and config.ignored == ("lm_head",)
    assert config.activation == "nvfp4"


def test_gpt_oss_mxfp4_checkpoint_matches_reference_and_honours_ignore_patterns(tmp_path: Path) -> None:
    source = build_tiny_checkpoint(tmp_path / "bf16", with_tokenizer=False)
    keep = ("model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj")
    weights = write_checkpoint(source, tmp_path / "mxfp4", gpt_oss_mxfp4, MXFP4, keep=keep)
    runner = _runner(tmp_path / "mxfp4")
    layers = runner.model.model.layers
    assert layers[0].self_attn.o_proj.weight.dtype == torch.float32  # matched by model.layers.*.self_attn.o_proj
    assert layers[0].mlp.down_proj.weight.dtype == torch.uint8
    assert layers[0].mlp.down_proj.weight_scale.dtype == torch.uint8  # e8m0 bytes
    error = _max_error(runner, reference_model(source, weights, None), quantized_activations=False)
    print(f"gpt-oss mxfp4: max |logit error| {error:.2e}")
    assert error <= WEIGHT_ONLY_ATOL


def _online_reference(source: Path, method: str):
    """The reference on the weights quantized as --quantization `method` does (merged matrices together: one
    NVFP4 per-tensor scale per merged weight), dequantized by this file's own decoder."""
    model = reference_model(source, {}, None)
    params, weights = dict(model.named_parameters()), {}
    merged_layers = [[f"model.layers.{layer}.{block}.{name}.weight" for name in group]
                     for layer in range(model.config.num_hidden_layers) for block, group in MERGED]
    for names in merged_layers:
        merged = torch.cat([params[name].data for name in names])
        if method == "nvfp4":
            packed, scale, global_scale = nvfp4_quantize(merged)
            step = scale.float().repeat_interleave(16, dim=1) * global_scale
        else:
            packed, scale = mxfp4_quantize(merged)
            step = torch.exp2(scale.float() - 127).repeat_interleave(32, dim=1)
        weights.update(zip(names, (decode(packed) * step).split([params[n].shape[0] for n in names])))
    return reference_model(source, weights, None)


@pytest.mark.parametrize("method", ["nvfp4", "mxfp4"])
def test_online_fp4_matches_dequantized_reference(tmp_path: Path, method: str) -> None:
    source = build_tiny_checkpoint(tmp_path, with_tokenizer=False)
    runner = _runner(source, method)
    assert runner.model.model.layers[1].mlp.down_proj.weight.dtype == torch.uint8
    assert runner.model_config.quantization.online
    error = _max_error(runner, _online_reference(source, method))
    print(f"online {method}: max |logit error| {error:.2e}")
    assert error <= WEIGHT_ONLY_ATOL


@pytest.mark.parametrize("quantization_config,field", [
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quant_algo"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32}, "group_size"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}},
     "quantization.exclude_modules"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}, "kv_cache_quant_algo"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": [1]}, "modules_to_not_convert"),
])
def test_malformed_fp4_config_is_refused_naming_the_field(tmp_path: Path, quantization_config: dict,
                                                          field: str) -> None:
    with pytest.raises(ValueError, match=rf"quantization_config\.{field}\b"):
        ModelConfig.from_pretrained(str(_write_config(tmp_path, quantization_config)))


def test_input_features_off_the_group_are_refused(tmp_path: Path) -> None:
    source = build_tiny_checkpoint(tmp_path, with_tokenizer=False, hidden_size=80, head_dim=16)
    with pytest.raises(ValueError, match=r"80 input features .* not a multiple of mxfp4's 32-element groups"):
        _runner(source, "mxfp4")


def test_fp4_flags_in_help_and_server_info(tmp_path: Path) -> None:
    import argparse

    from rapid_llm.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    help_text = " ".join(parser.format_help().split())
    assert "nvfp4 / mxfp4: FP4 weight only" in help_text and "compressed-tensors, modelopt, mxfp4" in help_text
    source = build_tiny_checkpoint(tmp_path)
    summary = ServerArgs(model=str(source), quantization="mxfp4").engine_config(str(source)).summary()
    assert summary["quantization"]["format"] == "mxfp4" and summary["quantization"]["group_size"] == 32
    config = json.loads((source / "config.json").read_text())
    assert "quantization_config" not in config


# Tiny widths off the groups (real models' widths are multiples of 128): refused naming the layer.
OFF_THE_GROUPS = {("DeepseekV4ForCausalLM", "nvfp4"): "attn.wq_b: its 24 input features",
                  ("DeepseekV4ForCausalLM", "mxfp4"): "attn.wq_b: its 24 input features",
                  ("DeepseekV3ForCausalLM", "mxfp4"): "q_b_proj: its 48 input features",
                  **{(moe, "mxfp4"): r"mlp.experts: its 48 input features \(w2\)"
                     for moe in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM")}}


@pytest.mark.parametrize("method", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_online_fp4_runs_every_architecture(tiny_checkpoint, architecture: str, method: str) -> None:
    """Every model family builds, loads and runs with its linear layers and MoE experts in FP4, or names the layer
    whose input width its tiny config puts off the format's groups."""
    refused = OFF_THE_GROUPS.get((architecture, method))
    if refused is not None:
        with pytest.raises(ValueError, match=refused):
            _runner(tiny_checkpoint(architecture), method)
        return
    runner = _runner(tiny_checkpoint(architecture), method)
    layers = [module for module in runner.model.modules() if isinstance(module, LinearBase)]
    assert any(layer.weight.dtype == torch.uint8 for layer in layers)
    assert all(torch.isfinite(logits).all() for logits in prefill_logits(runner, list(PROMPTS)))
