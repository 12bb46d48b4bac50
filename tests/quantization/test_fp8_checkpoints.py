"""FP8 checkpoints (per-tensor, per-row, block 128 and 32, ue8m0, static activations) load and give the logits of
the dequantize-then-matmul reference; online --quantization likewise; malformed configs are refused by field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.layers.linear import LinearBase
from rapid_llm.quantization.fp8_math import dequantize_weight, quantize_weight
from rapid_llm.utils.tiny_checkpoint import SUPPORTED_ARCHITECTURES, build_tiny_checkpoint
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.hf_reference import hf_logits
from tests.models.paged_generation import prefill_logits
from tests.quantization.logit_error import FLIP_ATOL, logit_error
from tests.quantization.fp8_reference import Format, reference_model, write_fp8_checkpoint

PROMPTS = ([11, 40, 7, 300, 52, 9, 81], [200, 3, 77, 150, 61, 19, 480, 33, 12, 90, 5, 250, 44],
           [5, 321, 17, 99, 402, 63, 8, 140, 271])
# Widths that fit each block: every merged shard starts on a tile, and some matrices end in a partial tile
# (block 32: hidden 80 -> qkv's input and o_proj's output; block 128: hidden 192).
SHAPES = {None: {}, 32: {"hidden_size": 80, "head_dim": 16, "intermediate_size": 96},
          128: {"hidden_size": 192, "head_dim": 64, "intermediate_size": 256}}
FORMATS = {
    "tensor": Format("tensor"), "tensor-static": Format("tensor", static=True), "row": Format("row"),
    "block128": Format("block", (128, 128)), "block32": Format("block", (32, 32)),
    "block32-ue8m0": Format("block", (32, 32), ue8m0=True), "block128-ue8m0": Format("block", (128, 128), ue8m0=True),
}
# fp32 everywhere, so our model and the reference differ only in summation order (merged GEMMs, paged
# attention), measured <= 7.2e-6 on logits of std ~1.6; a rounding flip of a quantized activation is what
# tests/quantization/logit_error.py leaves out. 1e-3 leaves room for summation order, not for a wrong scale.
LOGIT_ATOL = 1e-3


def _runner(checkpoint: Path, quantization: str | None = None, dtype: str = "auto") -> ModelRunner:
    config = ModelConfig.from_pretrained(str(checkpoint), dtype=dtype, quantization=quantization)
    return ModelRunner(config, CacheConfig(block_size=16, num_blocks=16), DeviceConfig("cpu"))


def _max_error(runner: ModelRunner, reference, quantized_activations: bool = True,
               flip_atol: float = FLIP_ATOL) -> float:
    """See tests/quantization/logit_error.py: with quantized activations, rounding flips of a few tokens pass."""
    return logit_error(runner, reference, PROMPTS, quantized_activations, flip_atol)


@pytest.mark.parametrize("name", FORMATS)
def test_fp8_checkpoint_matches_dequantized_reference(tmp_path: Path, name: str) -> None:
    fmt = FORMATS[name]
    source = build_tiny_checkpoint(tmp_path / "bf16", with_tokenizer=False, **SHAPES[fmt.block and fmt.block[0]])
    weights = write_fp8_checkpoint(source, tmp_path / "fp8", fmt)
    runner = _runner(tmp_path / "fp8")
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn
    assert runner.model.lm_head.weight.dtype == torch.float32  # embeddings, norms and the LM head stay
    error = _max_error(runner, reference_model(source, weights, fmt))
    print(f"{name}: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL


# Checkpoint matrices our layers merge: online quantization sees them as one weight (one per-tensor scale).
MERGED = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
          ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))


def _online_reference(source: Path, method: str, fmt: Format):
    """The reference on the weights quantized and dequantized as --quantization `method` does it (merged
    matrices quantized together); online fp8 quantizes activations per token, as the "row" format does."""
    model = reference_model(source, {}, None)
    params, weights = dict(model.named_parameters()), {}
    for layer in range(model.config.num_hidden_layers):
        for block, group in MERGED:
            names = [f"model.layers.{layer}.{block}.{name}.weight" for name in group]
            merged = torch.cat([params[name].data for name in names])
            q, scale = quantize_weight(merged, fmt.block, fmt.ue8m0, per_row=method == "fp8-rowwise")
            parts = dequantize_weight(q, scale, fmt.block, torch.float32).split([params[n].shape[0] for n in names])
            weights.update(zip(names, parts))
    return reference_model(source, weights, fmt)


@pytest.mark.parametrize("method,fmt", [("fp8", Format("row")), ("fp8-rowwise", Format("row")),
                                        ("fp8-block32", Format("block", (32, 32))),
                                        ("fp8-block32-ue8m0", Format("block", (32, 32), ue8m0=True)),
                                        ("fp8-block128", Format("block", (128, 128)))])
def test_online_quantization_matches_dequantized_reference(tmp_path: Path, method: str, fmt: Format) -> None:
    source = build_tiny_checkpoint(tmp_path, with_tokenizer=False, **SHAPES[fmt.block and fmt.block[0]])
    runner = _runner(source, method)
    assert runner.model.model.layers[1].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    error = _max_error(runner, _online_reference(source, method, fmt))
    print(f"{method}: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL


def test_online_quantization_of_a_bfloat16_model(tmp_path: Path) -> None:
    """bf16 moves many activations across an fp8 rounding step, so the bound is relative (the rule of
    tests/models/test_hf_parity.py): our error against the fp32 reference of the same fp8 weights stays within
    twice transformers' own bf16 error against it (the reference run in bf16), plus 0.05."""
    source = build_tiny_checkpoint(tmp_path, dtype=torch.bfloat16, with_tokenizer=False, **SHAPES[32])
    fmt = Format("block", (32, 32))
    reference = _online_reference(source, "fp8-block32", fmt)
    ours = prefill_logits(_runner(source, "fp8-block32"), list(PROMPTS))
    exact = [hf_logits(reference, prompt) for prompt in PROMPTS]
    theirs = [hf_logits(reference.to(torch.bfloat16), prompt) for prompt in PROMPTS]
    our_error = max((a - b).abs().max().item() for a, b in zip(ours, exact))
    their_error = max((a - b).abs().max().item() for a, b in zip(theirs, exact))
    print(f"bf16 fp8-block32 vs its fp32 reference: ours {our_error:.2e}, transformers bf16 {their_error:.2e}")
    assert our_error <= 2 * their_error + 0.05


def _write_config(tmp_path: Path, quantization_config: object) -> Path:
    source = build_tiny_checkpoint(tmp_path, with_tokenizer=False)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (source / "config.json").write_text(json.dumps(config))
    return source


@pytest.mark.parametrize("quantization_config,field", [
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt"),
    ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "activation_scheme"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128, 0]}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}, "activation_scheme"),
    ({"quant_method": "fp8", "scale_fmt": "e8m0x"}, "scale_fmt"),
    ({"quant_method": "fp8", "ignored_layers": "lm_head"}, "ignored_layers"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": -1}, "activation_scale_ub"),
    ({"quant_method": "nf4"}, "quant_method"),
])
def test_malformed_quantization_config_is_refused_naming_the_field(tmp_path: Path, quantization_config: dict,
                                                                   field: str) -> None:
    with pytest.raises(ValueError, match=rf"quantization_config\.{field}\b"):
        ModelConfig.from_pretrained(str(_write_config(tmp_path, quantization_config)))


def test_block_scales_that_would_split_a_merged_shard_are_refused(tmp_path: Path) -> None:
    """Default tiny widths: k starts at row 64 of qkv_proj, inside a 128-row tile."""
    source = _write_config(tmp_path, {"quant_method": "fp8", "weight_block_size": [128, 128]})
    with pytest.raises(ValueError, match=r"qkv_proj: shard 'k' starts at row 64 .* multiple of the FP8 block's 128"):
        _runner(source)


def test_flag_errors_help_and_server_info(tmp_path: Path) -> None:
    from rapid_llm.server_args import ServerArgs

    source = build_tiny_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="--quantization 'int3' is not an online method; choose one of fp8, "):
        ModelConfig.from_pretrained(str(source), quantization="int3")
    fp8_source = _write_config(tmp_path / "fp8", {"quant_method": "fp8"})
    with pytest.raises(ValueError, match="already quantized \\(fp8\\)"):
        ModelConfig.from_pretrained(str(fp8_source), quantization="fp8-block32")
    summary = ServerArgs(model=str(source), quantization="fp8-block128").engine_config(str(source)).summary()
    assert summary["quantization"]["name"] == "fp8 (block 128x128, dynamic activations, online)"
    assert summary["quantization"]["weight_block_size"] == [128, 128]
    assert ServerArgs(model=str(source)).engine_config(str(source)).summary()["quantization"] is None


def test_ignored_layers_stay_in_the_model_dtype(tmp_path: Path) -> None:
    fmt = Format("tensor")
    source = build_tiny_checkpoint(tmp_path / "bf16", with_tokenizer=False)
    keep = ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
            "model.layers.0.self_attn.v_proj")
    weights = write_fp8_checkpoint(source, tmp_path / "fp8", fmt, keep)
    runner = _runner(tmp_path / "fp8")
    layers = runner.model.model.layers
    assert layers[1].mlp.down_proj.weight.dtype == layers[0].self_attn.qkv_proj.weight.dtype == torch.float32
    assert layers[0].mlp.down_proj.weight.dtype == layers[1].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert _max_error(runner, reference_model(source, weights, fmt)) <= LOGIT_ATOL


def test_ignoring_part_of_a_merged_layer_is_refused(tmp_path: Path) -> None:
    source = _write_config(tmp_path, {"quant_method": "fp8", "ignored_layers": ["model.layers.0.mlp.up_proj"]})
    with pytest.raises(ValueError, match="ignores only some of the matrices merged into model.layers.0.mlp.gate_up"):
        _runner(source)


def test_online_fp8_quantizes_moe_experts_too(tmp_path: Path) -> None:
    """(Their logits against the reference: tests/quantization/test_moe_online.py.)"""
    source = build_tiny_checkpoint(tmp_path / "moe", "Qwen3MoeForCausalLM", with_tokenizer=False)
    runner = _runner(source, "fp8")
    assert runner.model.model.layers[1].mlp.down_proj.weight.dtype == torch.float8_e4m3fn  # the dense layer
    assert runner.model.model.layers[0].mlp.experts.w13_weight.dtype == torch.float8_e4m3fn
    assert all(torch.isfinite(logits).all() for logits in prefill_logits(runner, list(PROMPTS)))


def test_online_fp8_leaves_mla_kv_b_proj_in_the_model_dtype(tmp_path: Path) -> None:
    """MLA backends read kv_b_proj's weight in checkpoint layout, so online quantization leaves it alone."""
    source = build_tiny_checkpoint(tmp_path, "DeepseekV3ForCausalLM", with_tokenizer=False)
    runner = _runner(source, "fp8-rowwise")
    attention = runner.model.model.layers[0].self_attn
    assert attention.kv_b_proj.weight.dtype == torch.float32
    assert attention.o_proj.weight.dtype == torch.float8_e4m3fn
    quantized = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj", "gate_proj", "up_proj", "down_proj")
    weights = {name: dequantize_weight(*quantize_weight(param.data, None, per_row=True), None, torch.float32)
               for name, param in reference_model(source, {}, None).named_parameters()
               if name.endswith(".weight") and name.split(".")[-2] in quantized}
    error = _max_error(runner, reference_model(source, weights, Format("row")))
    print(f"DeepSeek-V3 fp8-rowwise: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL


@pytest.mark.parametrize("architecture", SUPPORTED_ARCHITECTURES)
def test_online_fp8_runs_every_architecture(tiny_checkpoint, architecture: str) -> None:
    """Every model family builds, loads and runs with its linear layers in fp8 (experts stay in the model dtype)."""
    runner = _runner(tiny_checkpoint(architecture), "fp8-rowwise")
    layers = [module for module in runner.model.modules() if isinstance(module, LinearBase)]
    assert any(layer.weight.dtype == torch.float8_e4m3fn for layer in layers)
    assert all(torch.isfinite(logits).all() for logits in prefill_logits(runner, list(PROMPTS)))
