"""Golden greedy identity: a tiny random Llama per quantized format, served with the Triton kernel and with torch_ref
(pinned through the op-backend override), picks the same greedy tokens.

The checkpoints are written by the quantization tests' own writers (FP8 block / static, GPTQ act-order W4A8, AWQ,
ModelOpt NVFP4 W4A4) or quantized online (fp8-rowwise, mxfp4). On CPU the Triton kernels run under the
interpreter, so for these tests their backend's CUDA condition is lifted; on a GPU (`-m gpu`) the same test runs
the model on CUDA. fp32 weights: the two paths differ in summation order only (~1e-6 on logits); a 5 % error in
one format's scales changes the tokens.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig  # noqa: E402
from rapid_llm.ops.conditions import Conditions  # noqa: E402
from rapid_llm.ops.registry import REGISTRY  # noqa: E402
from rapid_llm.sampling import SamplingParams  # noqa: E402
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint  # noqa: E402
from rapid_llm.worker_proc.model_runner import ModelRunner  # noqa: E402
from tests.models.paged_generation import generate  # noqa: E402
from tests.quantization.fp4_reference import modelopt_nvfp4, write_checkpoint  # noqa: E402
from tests.quantization.fp8_reference import Format, write_fp8_checkpoint  # noqa: E402
from tests.quantization.int4_reference import Int4Format, write_int4_checkpoint  # noqa: E402
from tests.quantization.test_fp4_checkpoints import MODELOPT  # noqa: E402

PROMPTS = [[11, 40, 7, 300, 52, 9, 81], [200, 3, 77, 150]]
NEW_TOKENS = 6
BLOCK32_SHAPE = {"hidden_size": 80, "head_dim": 16, "intermediate_size": 96}  # partial 32-tiles, as the FP8 tests

Writer = Callable[[Path, Path], object]
# name -> (op, shape overrides, checkpoint writer or None, online --quantization)
FORMATS: dict[str, tuple[str, dict, Writer | None, str | None]] = {
    "fp8-block32-ue8m0": ("fp8_linear", BLOCK32_SHAPE,
                          lambda src, dst: write_fp8_checkpoint(src, dst, Format("block", (32, 32), ue8m0=True)), None),
    "fp8-tensor-static": ("fp8_linear", {},
                          lambda src, dst: write_fp8_checkpoint(src, dst, Format("tensor", static=True)), None),
    "fp8-rowwise": ("fp8_linear", {}, None, "fp8-rowwise"),
    "gptq-act-order-w4a8": ("int4_linear", {}, lambda src, dst: write_int4_checkpoint(
        src, dst, Int4Format("gptq", 32, desc_act=True, w4a8=True)), None),
    "awq-g32": ("int4_linear", {}, lambda src, dst: write_int4_checkpoint(src, dst, Int4Format("awq", 32)), None),
    "modelopt-nvfp4-w4a4": ("fp4_linear", {}, lambda src, dst: write_checkpoint(
        src, dst, modelopt_nvfp4, MODELOPT, input_scales="input_scale"), None),
    "mxfp4": ("fp4_linear", {}, None, "mxfp4"),
}
OPS = ("fp8_linear", "int4_linear", "fp4_linear")


@pytest.fixture
def triton_anywhere() -> Iterator[None]:
    """The quantized ops' triton backends with only their library condition, so CPU tensors reach them."""
    saved = {op: REGISTRY.implementations(op) for op in OPS}
    try:
        for op, implementations in saved.items():
            # The registry has no unregister: the test swaps the list and puts it back.
            REGISTRY._implementations[op] = [
                replace(impl, conditions=Conditions.parse({"lib": "triton"})) if impl.backend == "triton" else impl
                for impl in implementations]
        yield
    finally:
        for op, implementations in saved.items():
            REGISTRY._implementations[op] = list(implementations)
        REGISTRY.set_overrides({})


def _greedy(checkpoint: Path, quantization: str | None, op: str, backend: str,
            device: torch.device) -> list[list[int]]:
    config = ModelConfig.from_pretrained(str(checkpoint), quantization=quantization)
    runner = ModelRunner(config, CacheConfig(block_size=16, num_blocks=16), DeviceConfig(device.type),
                         op_backends={op: backend})
    kernel = runner.model.model.layers[0].self_attn.qkv_proj.kernel
    assert getattr(kernel, "impl", getattr(kernel, "fn", None)) is REGISTRY.implementation(
        op, backend, device, torch.float32).fn
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    return [seq.output for seq in generate(runner, PROMPTS, params)]


@pytest.mark.parametrize("name", FORMATS)
def test_triton_and_reference_pick_the_same_greedy_tokens(tmp_path: Path, triton_device: torch.device,
                                                          triton_anywhere: None, name: str) -> None:
    op, shape, writer, online = FORMATS[name]
    checkpoint = build_tiny_checkpoint(tmp_path / "fp32", with_tokenizer=False, **shape)
    if writer is not None:
        writer(checkpoint, tmp_path / "quantized")
        checkpoint = tmp_path / "quantized"
    reference = _greedy(checkpoint, online, op, "torch_ref", triton_device)
    assert _greedy(checkpoint, online, op, "triton", triton_device) == reference
