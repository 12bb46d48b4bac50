"""Quantized MoE checkpoints: per-expert FP8 (per-tensor, static, per-row, block 128 / 32, ue8m0), compressed-tensors
NVFP4, ModelOpt NVFP4 W4A4 and gpt-oss-named MXFP4 experts of a tiny Qwen3-MoE (and FP8 Mixtral, DeepSeek-V4
`expert_dtype: fp4`) written from known tensors load, keep the experts quantized, and give the logits of transformers
with the dequantized weights (and fake-quantized expert inputs for W8A8 / W4A4); ignore lists reach the experts;
malformed or unfitting configs are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rapid_llm.config import ModelConfig
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from tests.quantization.fp4_reference import (
    add_w4a4_hooks,
    compressed_tensors_fake_quantize,
    compressed_tensors_nvfp4,
    gpt_oss_mxfp4,
    modelopt_nvfp4,
)
from tests.quantization.fp8_reference import Format
from tests.quantization.logit_error import MOE_FLIP_ATOL
from tests.quantization.moe_reference import (
    deepseek_fp4,
    expert_input_scale,
    fp8_activation,
    fp8_quantizer,
    reference_model,
    static_fp8_activation,
    write_moe_checkpoint,
)
from tests.quantization.test_compressed_tensors_checkpoints import preset_config
from tests.quantization.test_fp4_checkpoints import MODELOPT, W4A4_ATOL, WEIGHT_ONLY_ATOL
from tests.quantization.test_fp8_checkpoints import LOGIT_ATOL, _max_error, _runner

QWEN3_MOE = "Qwen3MoeForCausalLM"
# Every merged shard on a tile, and moe_intermediate_size a whole number of tiles (gate and up never share one).
SHAPES = {None: {"moe_intermediate_size": 48},
          32: {"moe_intermediate_size": 64, "intermediate_size": 96},
          128: {"hidden_size": 128, "head_dim": 64, "intermediate_size": 256, "moe_intermediate_size": 128}}
FP8_FORMATS = {"tensor": Format("tensor"), "tensor-static": Format("tensor", static=True), "row": Format("row"),
               "block128": Format("block", (128, 128)),
               "block32": Format("block", (32, 32)), "block32-ue8m0": Format("block", (32, 32), ue8m0=True)}


def _moe_error(runner, reference) -> float:
    """_max_error with the mixture-of-experts flip bound (tests/quantization/logit_error.py)."""
    return _max_error(runner, reference, flip_atol=MOE_FLIP_ATOL)


def _experts(runner):
    return runner.model.model.layers[0].mlp.experts


@pytest.mark.parametrize("name", FP8_FORMATS)
def test_fp8_experts_match_dequantized_reference(tmp_path: Path, name: str) -> None:
    fmt = FP8_FORMATS[name]
    source = build_tiny_checkpoint(tmp_path / "fp32", QWEN3_MOE, with_tokenizer=False,
                                   **SHAPES[fmt.block and fmt.block[0]])
    quantize = fp8_quantizer(fmt)
    weights = write_moe_checkpoint(source, tmp_path / "fp8", quantize, fmt.quantization_config(), dense=quantize,
                                   input_scales=("input_scale", 448.0) if fmt.static else None)
    runner = _runner(tmp_path / "fp8")
    assert _experts(runner).w13_weight.dtype == torch.float8_e4m3fn
    activation = static_fp8_activation(fmt, weights) if fmt.static else fp8_activation(fmt)
    error = _moe_error(runner, reference_model(source, weights, fmt, activation))
    print(f"fp8 experts {name}: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL


def test_fp8_mixtral_experts_match_dequantized_reference(tmp_path: Path) -> None:
    """Mixtral's checkpoint names its experts block_sparse_moe.experts.{e}.w1/w3/w2."""
    fmt = Format("tensor")
    source = build_tiny_checkpoint(tmp_path / "fp32", "MixtralForCausalLM", with_tokenizer=False)
    weights = write_moe_checkpoint(source, tmp_path / "fp8", fp8_quantizer(fmt), fmt.quantization_config(),
                                   dense=fp8_quantizer(fmt))
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in weights
    runner = _runner(tmp_path / "fp8")
    assert runner.model.model.layers[1].mlp.experts.w2_weight.dtype == torch.float8_e4m3fn
    error = _moe_error(runner, reference_model(source, weights, fmt, fp8_activation(fmt)))
    print(f"fp8 mixtral experts: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL


def test_deepseek_v4_fp4_experts_match_dequantized_reference(tmp_path: Path) -> None:
    """DeepSeek-V4's spelling: an fp8 config with `expert_dtype: fp4` and int8-packed experts with e8m0 scales
    (attention and the shared expert left unquantized by the ignore list, so only the experts change)."""
    source = build_tiny_checkpoint(tmp_path / "fp32", "DeepseekV4ForCausalLM", with_tokenizer=False)
    config = {"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4",
              "modules_to_not_convert": ["attn", "shared_experts"]}
    weights = write_moe_checkpoint(source, tmp_path / "fp4", deepseek_fp4, config)
    runner = _runner(tmp_path / "fp4")
    assert runner.model.model.layers[0].ffn.experts.w13_weight.dtype == torch.uint8
    error = _moe_error(runner, reference_model(source, weights))
    print(f"deepseek-v4 fp4 experts: max |logit error| {error:.2e}")
    assert error <= WEIGHT_ONLY_ATOL


@pytest.mark.parametrize("layout", ["compressed-tensors", "gpt-oss"])
def test_fp4_experts_match_dequantized_reference(tmp_path: Path, layout: str) -> None:
    """Weight-only NVFP4 (compressed-tensors, packed by the library) and MXFP4 (gpt-oss tensor names per expert)."""
    source = build_tiny_checkpoint(tmp_path / "fp32", QWEN3_MOE, with_tokenizer=False, **SHAPES[32])
    if layout == "compressed-tensors":
        quantize, config = compressed_tensors_nvfp4, preset_config("NVFP4A16", "nvfp4-pack-quantized", ["lm_head"])
    else:
        quantize, config = gpt_oss_mxfp4, {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}
    weights = write_moe_checkpoint(source, tmp_path / "fp4", quantize, config, dense=quantize)
    runner = _runner(tmp_path / "fp4")
    experts = _experts(runner)
    assert experts.w13_weight.dtype == torch.uint8 and experts.w13_weight.shape == (4, 128, 32)
    error = _moe_error(runner, reference_model(source, weights))
    print(f"{layout} fp4 experts: max |logit error| {error:.2e}")
    assert error <= WEIGHT_ONLY_ATOL


def test_modelopt_nvfp4_w4a4_experts_match_reference(tmp_path: Path) -> None:
    """ModelOpt NVFP4 (W4A4): each expert GEMM's input fake-quantized under its static scale (gate|up: the larger)."""
    source = build_tiny_checkpoint(tmp_path / "fp32", QWEN3_MOE, with_tokenizer=False, **SHAPES[32])
    weights = write_moe_checkpoint(source, tmp_path / "nvfp4", modelopt_nvfp4, MODELOPT, dense=modelopt_nvfp4,
                                   input_scales=("input_scale", 448.0 * 6))
    runner = _runner(tmp_path / "nvfp4")
    assert _experts(runner).w2_weight.dtype == torch.uint8

    def activation(x: torch.Tensor, layer: str, expert: int, projection: str) -> torch.Tensor:
        global_scale = 1 / expert_input_scale(weights, layer, expert, projection)
        return compressed_tensors_fake_quantize(x, global_scale.reshape(1))

    reference = reference_model(source, weights, None, activation)
    add_w4a4_hooks(reference, weights)
    error = _moe_error(runner, reference)
    print(f"modelopt nvfp4 W4A4 experts: max |logit error| {error:.2e}")
    assert error <= W4A4_ATOL


def test_ignore_list_keeps_experts_in_the_model_dtype(tmp_path: Path) -> None:
    """`modules_to_not_convert` naming a layer's experts: those load unquantized, the other layer's do not."""
    fmt = Format("row")
    source = build_tiny_checkpoint(tmp_path / "fp32", QWEN3_MOE, with_tokenizer=False)
    config = {**fmt.quantization_config(), "modules_to_not_convert": ["lm_head", "model.layers.2.mlp.experts"]}
    weights = write_moe_checkpoint(source, tmp_path / "fp8", fp8_quantizer(fmt), config, dense=fp8_quantizer(fmt),
                                   keep=("model.layers.2.mlp.experts",))
    runner = _runner(tmp_path / "fp8")
    layers = runner.model.model.layers
    assert layers[2].mlp.experts.w13_weight.dtype == torch.float32
    assert layers[0].mlp.experts.w13_weight.dtype == torch.float8_e4m3fn
    assert _moe_error(runner, reference_model(source, weights, fmt, fp8_activation(fmt))) <= LOGIT_ATOL


def _with_config(tmp_path: Path, quantization_config: dict, **shape: object) -> Path:
    source = build_tiny_checkpoint(tmp_path, QWEN3_MOE, with_tokenizer=False, **shape)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (source / "config.json").write_text(json.dumps(config))
    return source


@pytest.mark.parametrize("expert_dtype", ["fp5", 8, ["fp4"]])
def test_malformed_expert_dtype_is_refused_naming_the_field(tmp_path: Path, expert_dtype: object) -> None:
    config = {"quant_method": "fp8", "weight_block_size": [32, 32], "expert_dtype": expert_dtype}
    source = _with_config(tmp_path, config)
    with pytest.raises(ValueError, match=r"quantization_config\.expert_dtype\b"):
        ModelConfig.from_pretrained(str(source))


def test_configs_the_experts_cannot_take_are_refused(tmp_path: Path) -> None:
    partly = _with_config(tmp_path / "partly", {"quant_method": "fbgemm_fp8",
                                                "modules_to_not_convert": ["model.layers.0.mlp.experts.1"]})
    with pytest.raises(ValueError, match=r"ignores only some of the matrices merged into model\.layers\.0\.mlp\."):
        _runner(partly)
    tiles = _with_config(tmp_path / "tiles", {"quant_method": "fp8", "weight_block_size": [32, 32]})
    with pytest.raises(ValueError, match=r"experts model\.layers\.0\.mlp\.experts: moe_intermediate_size 48 is not a "
                                         r"multiple of the FP8 block's 32 rows"):
        _runner(tiles)
    gptq = _with_config(tmp_path / "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True})
    with pytest.raises(ValueError, match=r"gptq MoE experts are not supported"):
        _runner(gptq)
