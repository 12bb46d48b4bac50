"""The cpu_table paths equal torch_ref bit for bit. fp8_linear (bytes decoded by a table gather): every finite e4m3
byte, per-tensor / per-row / block scales with partial tiles, static and dynamic activations. fp4_linear (nibbles
decoded by table gathers): every byte, NVFP4 with per-tensor and per-row globals and W4A4, MXFP4. Every dtype."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.ops.fp4_linear import Fp4LinearSpec, fp4_linear, fp4_linear_table
from rapid_llm.ops.fp8_linear import Fp8LinearSpec, fp8_linear, fp8_linear_table
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.fp4_math import mxfp4_quantize, nvfp4_global_scale, nvfp4_quantize
from rapid_llm.quantization.fp8_math import FP8_DTYPE, quantize_weight


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("block", "per_row", "static"), [(None, False, False), (None, False, True),
                                                         (None, True, False), ((32, 32), False, False),
                                                         ((128, 128), False, False)])
def test_fp8_equals_the_reference(block: tuple[int, int] | None, per_row: bool, static: bool, dtype: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 200).to(dtype_from_name(dtype))
    weight, scale = quantize_weight(torch.randn(72, 200) * 0.1, block, per_row=per_row)
    finite = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE)
    finite = finite[finite.float().isfinite()]
    weight.view(-1)[: finite.numel()] = finite  # every byte, at several scales
    input_scale = (x.float().abs().amax() / 448).reshape(()) if static else None
    spec = Fp8LinearSpec(block, static, block[1] if block else None)
    bias = torch.randn(72).to(x.dtype)
    assert torch.equal(fp8_linear_table(x, weight, scale, input_scale, spec, bias),
                       fp8_linear(x, weight, scale, input_scale, spec, bias))


def test_fp8_is_the_cpu_default() -> None:
    assert REGISTRY.select("fp8_linear", "cpu", "bfloat16").fn is fp8_linear_table


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("fmt", "w4a4", "row_global"), [("nvfp4", False, False), ("nvfp4", True, True),
                                                        ("mxfp4", False, False)])
def test_fp4_equals_the_reference(fmt: str, w4a4: bool, row_global: bool, dtype: str) -> None:
    torch.manual_seed(1)
    x = torch.randn(5, 96).to(dtype_from_name(dtype))
    w = torch.randn(40, 96) * 0.1
    weight_global = input_global = None
    if fmt == "mxfp4":
        weight, scale = mxfp4_quantize(w)
        # The subnormal, a tiny and a large (fp16-safe) e8m0 scale.
        scale[0, :3] = torch.tensor([0, 1, 140], dtype=torch.uint8)
    else:
        weight, scale, weight_global = nvfp4_quantize(w)
        weight_global = torch.rand(40, 1) if row_global else weight_global.reshape(1, 1)
    if w4a4:
        input_global = nvfp4_global_scale(x.float().abs().amax())
    weight.view(-1)[:256] = torch.arange(256, dtype=torch.int32).to(torch.uint8)  # every byte (code pair)
    spec = Fp4LinearSpec(fmt, "nvfp4" if w4a4 else "none")
    args = (x, weight, scale, weight_global, input_global, spec, torch.randn(40).to(x.dtype))
    assert torch.equal(fp4_linear_table(*args), fp4_linear(*args))


def test_fp4_is_the_cpu_default() -> None:
    assert REGISTRY.select("fp4_linear", "cpu", "bfloat16").fn is fp4_linear_table
