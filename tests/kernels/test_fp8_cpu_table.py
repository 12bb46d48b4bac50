"""fp8_linear cpu_table (the fp8 bytes decoded by a table gather) equals torch_ref bit for bit: every finite e4m3
byte, per-tensor / per-row / block scales with partial tiles, static and dynamic activations, every dtype."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.ops.fp8_linear import Fp8LinearSpec, fp8_linear, fp8_linear_table
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.fp8_math import FP8_DTYPE, quantize_weight


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(("block", "per_row", "static"), [(None, False, False), (None, False, True),
                                                         (None, True, False), ((32, 32), False, False),
                                                         ((128, 128), False, False)])
def test_equals_the_reference(block: tuple[int, int] | None, per_row: bool, static: bool, dtype: str) -> None:
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


def test_is_the_cpu_default() -> None:
    assert REGISTRY.select("fp8_linear", "cpu", "bfloat16").fn is fp8_linear_table
