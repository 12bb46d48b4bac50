"""rapid_llm.quantize: GPTQ and AWQ beat round-to-nearest on the activations they calibrate on (per weight, and
end to end through `python -m rapid_llm.quantize` on a tiny model, whose checkpoint rapid_llm then loads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.quantization.int4_math import dequantize
from rapid_llm.quantize.__main__ import main
from rapid_llm.quantize.awq import search_scales
from rapid_llm.quantize.calibration import calibration_samples
from rapid_llm.quantize.gptq import HessianAccumulator, gptq_quantize
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.quantization.int4_reference import dequantize_groups, quantize_groups
from tools.demo_model.data import DATA_DIR, MANIFEST_NAME, SOURCE


def _correlated_inputs(rows: int, features: int, seed: int) -> torch.Tensor:
    """Activations with correlated features and a few large channels, as real layer inputs have."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(features, features, generator=generator) / features**0.5
    x = torch.randn(rows, features, generator=generator) @ (torch.eye(features) + 0.8 * mixing)
    x[:, :4] *= 8
    return x


def _rtn(w: torch.Tensor, group_size: int, sym: bool) -> torch.Tensor:
    size = w.shape[1] if group_size == -1 else group_size
    groups = [list(range(start, start + size)) for start in range(0, w.shape[1], size)]
    q, grids = quantize_groups(w, groups, sym, min_zero=0)
    return dequantize_groups(q, groups, grids, fp16_scales=False)


def _output_mse(x: torch.Tensor, w: torch.Tensor, approx: torch.Tensor) -> float:
    return ((x @ approx.t() - x @ w.t()) ** 2).mean().item()


@pytest.mark.parametrize("group_size,sym,desc_act", [(32, True, False), (32, False, False), (-1, True, False),
                                                     (32, True, True), (64, False, True)])
def test_gptq_output_error_below_rtn(group_size: int, sym: bool, desc_act: bool) -> None:
    x = _correlated_inputs(2048, 128, seed=0)
    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(1)) * 0.05
    hessian = HessianAccumulator(128)
    for part in x.split(500):
        hessian.add(part)
    q, scales, zeros, g_idx = gptq_quantize(w, hessian.hessian(), group_size, sym, desc_act)
    approx = dequantize(q, scales[:, g_idx.long()], zeros[:, g_idx.long()], 1, torch.float32)
    gptq, rtn = _output_mse(x, w, approx), _output_mse(x, w, _rtn(w, group_size, sym))
    print(f"group {group_size} sym {sym} act-order {desc_act}: output MSE gptq {gptq:.3e} rtn {rtn:.3e}")
    assert gptq < 0.8 * rtn
    if desc_act:
        assert not torch.equal(g_idx.long(), torch.arange(128) // (128 if group_size == -1 else group_size))


def test_awq_scales_reduce_output_error_below_rtn() -> None:
    x = _correlated_inputs(2048, 128, seed=2)
    w = torch.randn(96, 128, generator=torch.Generator().manual_seed(3)) * 0.05
    s = search_scales(x, [w], 32)
    assert not torch.allclose(s, torch.ones_like(s))
    awq = _output_mse(x, w, _rtn(w * s, 32, sym=False) / s)
    rtn = _output_mse(x, w, _rtn(w, 32, sym=False))
    print(f"output MSE awq {awq:.3e} rtn {rtn:.3e}")
    assert awq < 0.9 * rtn


SHAPES = {"hidden_size": 128, "head_dim": 32, "intermediate_size": 256, "num_hidden_layers": 2}
SAMPLES, SEQ_LEN = 8, 64


def _rms(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight


DEMO_TRAIN_SOURCE = json.loads((DATA_DIR / MANIFEST_NAME).read_text())["source"]


@pytest.mark.skipif(SOURCE != DEMO_TRAIN_SOURCE, reason=f"--dataset demo-train is the train split of "
                    f"{DEMO_TRAIN_SOURCE} (tools/demo_model/data/manifest.json); this Python has the {SOURCE}")
@pytest.mark.parametrize("method,extra", [("gptq", ["--no-sym"]), ("gptq", ["--desc-act"]), ("awq", [])])
def test_quantize_command_writes_a_checkpoint_that_loads_and_beats_rtn(tmp_path: Path, method: str,
                                                                      extra: list[str]) -> None:
    """Layer 0's q/k/v outputs on the calibration activations: the loaded int4 layer (behind AWQ's folded norm)
    against the fp32 model, compared with round-to-nearest of the same weights at the same group size."""
    source = build_tiny_checkpoint(tmp_path / "fp32", **SHAPES)
    out = tmp_path / method
    main(["--model", str(source), "--method", method, "--group-size", "32", "--num-samples", str(SAMPLES),
          "--seq-len", str(SEQ_LEN), "--out", str(out), *extra])
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == method and config["meta"]["num_samples"] == SAMPLES
    assert config["meta"]["dataset"].startswith("demo-train")
    assert (out / "tokenizer.json").exists()

    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    caught = {}
    model.model.layers[0].input_layernorm.register_forward_pre_hook(lambda _, args: caught.update(h=args[0]))
    samples, _ = calibration_samples("demo-train", transformers.AutoTokenizer.from_pretrained(source), SAMPLES,
                                     SEQ_LEN)
    with torch.no_grad():
        model(samples, use_cache=False)
    h = caught["h"].reshape(-1, SHAPES["hidden_size"])
    attention, eps = model.model.layers[0].self_attn, model.config.rms_norm_eps
    w = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]).detach()
    x = _rms(h, model.model.layers[0].input_layernorm.weight.detach(), eps)

    runner = ModelRunner(ModelConfig.from_pretrained(str(out)), CacheConfig(block_size=16, num_blocks=16),
                         DeviceConfig("cpu"))
    layer = runner.model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.dtype == torch.uint8
    from safetensors.torch import load_file

    folded = load_file(out / "model.safetensors")["model.layers.0.input_layernorm.weight"].float()
    with torch.no_grad():
        ours = ((layer.self_attn.qkv_proj(_rms(h, folded, eps)) - x @ w.t()) ** 2).mean().item()
    rtn = _output_mse(x, w, _rtn(w, 32, sym=method == "gptq" and "--no-sym" not in extra))
    print(f"{method} {extra}: layer-0 qkv output MSE {ours:.3e}, RTN {rtn:.3e}")
    assert ours < rtn
