"""compressed-tensors checkpoints (`quant_method: compressed-tensors`): NVFP4 (W4A16 and W4A4) packed and
dequantized by the compressed_tensors library, and FP8 (`float-quantized`: channel, tensor, block) mapped onto the
FP8 method, give the dequantize-then-matmul reference's logits; configs come from the library's preset schemes;
malformed ones are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rapid_llm.config import ModelConfig
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from tests.quantization.fp4_reference import add_w4a4_hooks, compressed_tensors_nvfp4, write_checkpoint
from tests.quantization.fp8_reference import Format, reference_model, write_fp8_checkpoint
from tests.quantization.test_fp4_checkpoints import W4A4_ATOL, WEIGHT_ONLY_ATOL, _max_error, _runner
from tests.quantization.test_fp8_checkpoints import LOGIT_ATOL, SHAPES, _write_config


def preset_config(preset: str, fmt: str, ignore: list[str], **weights: object) -> dict:
    """The quantization_config compressed-tensors writes for one preset scheme on every Linear."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, ["Linear"])
    config = json.loads(QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=ignore,
                                           quantization_status="compressed").model_dump_json())
    config["config_groups"]["group_0"]["weights"].update(weights)
    return config


@pytest.mark.parametrize("preset", ["NVFP4A16", "NVFP4"])
def test_compressed_tensors_nvfp4_matches_reference(tmp_path: Path, preset: str) -> None:
    source = build_tiny_checkpoint(tmp_path / "bf16", with_tokenizer=False)
    keep = ("model.layers.1.mlp.down_proj",)
    config = preset_config(preset, "nvfp4-pack-quantized", ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"])
    w4a4 = preset == "NVFP4"
    weights = write_checkpoint(source, tmp_path / "ct", compressed_tensors_nvfp4, config,
                               input_scales="input_global_scale" if w4a4 else None, keep=keep)
    runner = _runner(tmp_path / "ct")
    layers = runner.model.model.layers
    assert layers[0].mlp.down_proj.weight.dtype == torch.uint8
    assert layers[1].mlp.down_proj.weight.dtype == torch.float32  # the re: ignore entry
    assert runner.model_config.quantization.activation == ("nvfp4" if w4a4 else "none")
    reference = reference_model(source, weights, None)
    if w4a4:
        add_w4a4_hooks(reference, weights)
    error = _max_error(runner, reference)
    print(f"compressed-tensors {preset}: max |logit error| {error:.2e}")
    assert error <= (W4A4_ATOL if w4a4 else WEIGHT_ONLY_ATOL)


FP8_PRESETS = {"FP8_DYNAMIC": Format("row"), "FP8": Format("tensor", static=True),
               "FP8_BLOCK": Format("block", (32, 32))}


@pytest.mark.parametrize("preset", FP8_PRESETS)
def test_compressed_tensors_fp8_loads_through_the_fp8_method(tmp_path: Path, preset: str) -> None:
    fmt = FP8_PRESETS[preset]
    source = build_tiny_checkpoint(tmp_path / "bf16", with_tokenizer=False, **SHAPES[fmt.block and fmt.block[0]])
    weights = write_fp8_checkpoint(source, tmp_path / "ct", fmt)
    tensors = {name.replace("weight_scale_inv", "weight_scale"): tensor.reshape(-1) if tensor.dim() == 0 else tensor
               for name, tensor in load_file(tmp_path / "ct" / "model.safetensors").items()}
    save_file(tensors, tmp_path / "ct" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "ct" / "config.json").read_text())
    config["quantization_config"] = preset_config(preset, "float-quantized", ["lm_head"])
    if fmt.block:
        config["quantization_config"]["config_groups"]["group_0"]["weights"]["block_structure"] = list(fmt.block)
        config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["group_size"] = fmt.block[1]
    (tmp_path / "ct" / "config.json").write_text(json.dumps(config))
    runner = _runner(tmp_path / "ct")
    assert runner.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert runner.model_config.quantization.granularity == fmt.granularity
    error = _max_error(runner, reference_model(source, weights, fmt))
    print(f"compressed-tensors {preset}: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL


def _group(config: dict) -> dict:
    return config["config_groups"]["group_0"]


def _malformed(change, preset: str = "NVFP4", fmt: str = "nvfp4-pack-quantized") -> dict:
    config = preset_config(preset, fmt, ["lm_head"])
    change(config)
    return config


@pytest.mark.parametrize("quantization_config,field", [
    (_malformed(lambda c: c.update(format="marlin-24")), "format"),
    (_malformed(lambda c: c["config_groups"].update(group_1=_group(c))), "config_groups"),
    (_malformed(lambda c: _group(c).update(targets=["re:.*q_proj"])), "config_groups.group_0.targets"),
    (_malformed(lambda c: _group(c)["weights"].update(group_size=32)), "config_groups.group_0.weights.group_size"),
    (_malformed(lambda c: _group(c)["input_activations"].update(num_bits=8)),
     "config_groups.group_0.input_activations.num_bits"),
    (_malformed(lambda c: c.update(ignore="lm_head")), "ignore"),
    (_malformed(lambda c: c.update(kv_cache_scheme={"num_bits": 4, "type": "int"})), "kv_cache_scheme"),
    (preset_config("FP8_DYNAMIC", "float-quantized", [], strategy="group"), "config_groups.group_0.weights.strategy"),
    (preset_config("FP8_BLOCK", "float-quantized", [], block_structure=[128]),
     "config_groups.group_0.weights.block_structure"),
    (_malformed(lambda c: _group(c).update(input_activations=None), "FP8_DYNAMIC", "float-quantized"),
     "config_groups.group_0.input_activations"),
])
def test_malformed_compressed_tensors_config_is_refused_naming_the_field(tmp_path: Path, quantization_config: dict,
                                                                         field: str) -> None:
    with pytest.raises(ValueError, match=rf"quantization_config\.{field}\b"):
        ModelConfig.from_pretrained(str(_write_config(tmp_path, quantization_config)))
