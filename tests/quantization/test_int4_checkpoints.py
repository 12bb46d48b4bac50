"""GPTQ (sym/asym, groups 32/128/per-channel, act-order) and AWQ int4 checkpoints, W4A16 and W4A8, load and give
the logits of the dequantize-then-matmul reference; online w4a16/w4a8 likewise; malformed configs are refused by
field; modules_to_not_convert stays in the model dtype; the fast path and the reference agree token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import demo_model_dir
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.models.paged_generation import generate
from tests.quantization.test_fp8_checkpoints import _max_error, _write_config
from tests.quantization.int4_reference import (LINEAR_NAMES, Int4Format, dequantize_groups, quantize_groups,
                                               reference_model, write_int4_checkpoint)

# Group 128 needs every input width a multiple of 128 (o_proj's is heads x head_dim).
SHAPES = {32: {}, -1: {}, 128: {"hidden_size": 256, "head_dim": 64, "intermediate_size": 256}}
FORMATS = {
    "gptq-sym-g32": Int4Format("gptq", 32, sym=True), "gptq-asym-g32": Int4Format("gptq", 32),
    "gptq-sym-g128": Int4Format("gptq", 128, sym=True), "gptq-asym-g128": Int4Format("gptq", 128),
    "gptq-asym-per-channel": Int4Format("gptq", -1), "gptq-sym-per-channel": Int4Format("gptq", -1, sym=True),
    "gptq-act-order-g32": Int4Format("gptq", 32, desc_act=True),
    "gptq-act-order-g128-sym": Int4Format("gptq", 128, sym=True, desc_act=True),
    "awq-g32": Int4Format("awq", 32), "awq-g128": Int4Format("awq", 128), "awq-per-channel": Int4Format("awq", -1),
    "gptq-w4a8-g32": Int4Format("gptq", 32, w4a8=True), "awq-w4a8-g128": Int4Format("awq", 128, w4a8=True),
}
# fp32 throughout, so ours and the reference differ in summation order and in cpu_int4pack's fp32 zero term
# ((8 - zero) * scale, measured <= 3e-5 on logits of std ~1.6); W4A8 can move an activation across an int8
# rounding step, hence its looser bound. A wrong nibble order or zero offset moves logits by > 0.1.
LOGIT_ATOL = 2e-3
W4A8_LOGIT_ATOL = 2e-2


def _runner(checkpoint: Path, quantization: str | None = None, dtype: str = "auto",
            backend: str | None = None) -> ModelRunner:
    config = ModelConfig.from_pretrained(str(checkpoint), dtype=dtype, quantization=quantization)
    return ModelRunner(config, CacheConfig(block_size=16, num_blocks=16), DeviceConfig("cpu"),
                       op_backends={"int4_linear": backend} if backend else None)


@pytest.mark.parametrize("backend", ["torch_ref", "cpu_int4pack"])
@pytest.mark.parametrize("name", FORMATS)
def test_int4_checkpoint_matches_dequantized_reference(tmp_path: Path, name: str, backend: str) -> None:
    fmt = FORMATS[name]
    source = build_tiny_checkpoint(tmp_path / "fp32", with_tokenizer=False, **SHAPES[fmt.group_size])
    weights = write_int4_checkpoint(source, tmp_path / "int4", fmt)
    runner = _runner(tmp_path / "int4", backend=backend)
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.kernel.impl is REGISTRY.implementation("int4_linear", backend, "cpu", torch.float32).fn
    config = runner.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    qkv_rows = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    assert qkv.weight.dtype == torch.uint8 and qkv.weight.numel() * 2 == qkv_rows * config.hidden_size  # 4 bits
    assert hasattr(qkv, "input_perm") == fmt.desc_act
    assert runner.model.lm_head.weight.dtype == torch.float32  # embeddings, norms and the LM head stay
    error = _max_error(runner, reference_model(source, weights, fmt.w4a8), quantized_activations=fmt.w4a8)
    print(f"{name} {backend}: max |logit error| {error:.2e}")
    assert error <= (W4A8_LOGIT_ATOL if fmt.w4a8 else LOGIT_ATOL)


def _online_reference(source: Path, w4a8: bool):
    """The reference with every linear weight quantized by the test's own round-to-nearest, groups of 128
    (per-row grids, so merging matrices along their outputs, as our layers do, changes nothing)."""
    model = reference_model(source, {}, False)
    weights = {}
    for name, param in model.named_parameters():
        if name.endswith(".weight") and name.split(".")[-2] in LINEAR_NAMES:
            groups = [list(range(start, start + 128)) for start in range(0, param.shape[1], 128)]
            q, grids = quantize_groups(param.data, groups, sym=False, min_zero=0)
            weights[name] = dequantize_groups(q, groups, grids, fp16_scales=False)
    return reference_model(source, weights, w4a8)


@pytest.mark.parametrize("method", ["w4a16", "w4a8"])
def test_online_int4_matches_dequantized_reference(tmp_path: Path, method: str) -> None:
    source = build_tiny_checkpoint(tmp_path, with_tokenizer=False, **SHAPES[128])
    runner = _runner(source, method)
    assert runner.model.model.layers[1].mlp.down_proj.weight.dtype == torch.uint8
    error = _max_error(runner, _online_reference(source, method == "w4a8"), quantized_activations=method == "w4a8")
    print(f"{method}: max |logit error| {error:.2e}")
    assert error <= (W4A8_LOGIT_ATOL if method == "w4a8" else LOGIT_ATOL)


def test_online_int4_refuses_widths_off_its_groups(tmp_path: Path) -> None:
    source = build_tiny_checkpoint(tmp_path, with_tokenizer=False)  # hidden 64
    with pytest.raises(ValueError, match=r"w4a16 .*: linear layer model.layers.0.self_attn.qkv_proj: its 64 input "
                                         r"features are not a whole number of int4 groups of 128"):
        _runner(source, "w4a16")


def test_modules_to_not_convert_stay_in_the_model_dtype(tmp_path: Path) -> None:
    fmt = Int4Format("gptq", 32)
    source = build_tiny_checkpoint(tmp_path / "fp32", with_tokenizer=False)
    keep = ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
            "model.layers.0.self_attn.v_proj")
    weights = write_int4_checkpoint(source, tmp_path / "int4", fmt, keep)
    runner = _runner(tmp_path / "int4")
    layers = runner.model.model.layers
    assert layers[1].mlp.down_proj.weight.dtype == layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert layers[0].mlp.down_proj.weight.dtype == layers[1].self_attn.qkv_proj.weight.dtype == torch.uint8
    assert _max_error(runner, reference_model(source, weights, False), quantized_activations=False) <= LOGIT_ATOL


@pytest.mark.parametrize("quantization_config,field", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits"),
    ({"quant_method": "gptq", "group_size": 128}, "bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size"),
    ({"quant_method": "gptq", "bits": 4, "group_size": "128"}, "group_size"),
    ({"quant_method": "gptq", "bits": 4, "sym": "yes"}, "sym"),
    ({"quant_method": "gptq", "bits": 4, "desc_act": 1}, "desc_act"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, "checkpoint_format"),
    ({"quant_method": "gptq", "bits": 4, "activation_bits": 4}, "activation_bits"),
    ({"quant_method": "gptq", "bits": 4, "modules_to_not_convert": "lm_head"}, "modules_to_not_convert"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits"),
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": -2}, "q_group_size"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version"),
    ({"quant_method": "awq", "bits": 4, "zero_point": False}, "zero_point"),
])
def test_malformed_int4_config_is_refused_naming_the_field(tmp_path: Path, quantization_config: dict,
                                                           field: str) -> None:
    with pytest.raises(ValueError, match=rf"quantization_config\.{field}\b"):
        ModelConfig.from_pretrained(str(_write_config(tmp_path, quantization_config)))


def test_act_order_merged_shards_must_share_g_idx(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    source = build_tiny_checkpoint(tmp_path / "fp32", with_tokenizer=False)
    write_int4_checkpoint(source, tmp_path / "int4", Int4Format("gptq", 32, desc_act=True))
    tensors = load_file(tmp_path / "int4" / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.g_idx"] = tensors["model.layers.0.self_attn.k_proj.g_idx"].flip(0)
    save_file(tensors, tmp_path / "int4" / "model.safetensors")
    with pytest.raises(ValueError, match="the g_idx of the matrices merged into it differ"):
        _runner(tmp_path / "int4")


def test_flag_help_and_server_info(tmp_path: Path) -> None:
    from rapid_llm.server_args import ServerArgs

    source = build_tiny_checkpoint(tmp_path, **SHAPES[128])
    summary = ServerArgs(model=str(source), quantization="w4a8").engine_config(str(source)).summary()
    assert summary["quantization"]["name"] == "int4 w4a8 (group 128, asymmetric, online)"
    assert summary["quantization"]["activation_bits"] == 8
    gptq = _write_config(tmp_path / "gptq", Int4Format("gptq", 32, desc_act=True).quantization_config())
    assert ModelConfig.from_pretrained(str(gptq)).quantization.name == \
        "gptq w4a16 (group 32, asymmetric, act-order, checkpoint)"
    with pytest.raises(ValueError, match="already quantized \\(gptq\\)"):
        ModelConfig.from_pretrained(str(gptq), quantization="w4a16")


def test_greedy_tokens_fast_path_equal_reference_on_the_demo_model() -> None:
    """The trained demo model in fp32, online w4a16: cpu_int4pack and torch_ref pick the same greedy tokens."""
    prompts = [[0, 563, 2047, 318, 29], [0, 1200, 31, 77, 4051, 12, 9], [0, 88, 3000, 5, 641]]
    params = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=24)
    outputs = {}
    for backend in ("torch_ref", "cpu_int4pack"):
        runner = _runner(demo_model_dir("demo-target"), "w4a16", "float32", backend)
        outputs[backend] = [seq.output for seq in generate(runner, prompts, params)]
    assert outputs["torch_ref"] == outputs["cpu_int4pack"]
