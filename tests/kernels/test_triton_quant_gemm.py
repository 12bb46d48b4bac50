"""The Triton quantized linears (fp8_linear, int4_linear, fp4_linear) against their torch references, per format.

Shapes are small and off the kernel's tiles (N 72 / 200 against BLOCK_N 64, K 70 / 80 / 104 / 160 against BLOCK_K
32, partial FP8 scale tiles at both edges), with M = 1 (decode), 7 and 33. Both sides round the dequantized weight
and the fake-quantized activations where the reference does, so they differ in summation order only: fp32 within
1e-5; fp16 2e-3 (a summation-order step); bf16 3e-2, about four steps at 1, because Triton's interpreter rounds
fp32 -> bf16 by truncation (weights, activations and the output each get that bias).
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.config.dtypes import dtype_from_name  # noqa: E402
from rapid_llm.ops import fp4_linear as fp4_ref  # noqa: E402
from rapid_llm.ops import fp8_linear as fp8_ref  # noqa: E402
from rapid_llm.ops.int4_linear import TORCH_INT4, Int4LinearSpec  # noqa: E402
from rapid_llm.ops.registry import REGISTRY  # noqa: E402
from rapid_llm.ops.triton import quant_fp4_gemm, quant_fp8_gemm  # noqa: E402
from rapid_llm.ops.triton.quant_int4_gemm import TRITON_INT4  # noqa: E402
from rapid_llm.quantization.fp4_math import mxfp4_quantize, nvfp4_global_scale, nvfp4_quantize  # noqa: E402
from rapid_llm.quantization.fp8_math import quantize_weight  # noqa: E402
from rapid_llm.quantization.int4_math import quantize_rtn  # noqa: E402

DTYPES = ["fp32", "bf16", "fp16"]
TOKENS = [1, 7, 33]
TOLERANCES = {"fp32": {"atol": 1e-5, "rtol": 1e-5}, "fp16": {"atol": 2e-3, "rtol": 2e-3},
              "bf16": {"atol": 3e-2, "rtol": 3e-2}}
# name -> (out, in, block, per_row, static activations, ue8m0, amax bound)
FP8_FORMATS = {
    "tensor": (72, 70, None, False, False, False, None),
    "tensor-static": (72, 70, None, False, True, False, None),
    "row": (72, 70, None, True, False, False, None),
    "row-amax-bound": (72, 70, None, True, False, False, 1.5),
    "block128": (200, 160, (128, 128), False, False, False, None),
    "block32": (72, 80, (32, 32), False, False, False, None),
    "block32-ue8m0": (72, 80, (32, 32), False, False, True, None),
}


def _inputs(device: torch.device, dtype: str, tokens: int, out_features: int, in_features: int,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(tokens * 1000 + out_features + in_features)
    x = torch.randn(tokens, in_features, device=device).to(dtype_from_name(dtype))
    w = torch.randn(out_features, in_features, device=device) * in_features**-0.5
    return x, w, torch.randn(out_features, device=device).to(x.dtype)


def over(formats: dict) -> Callable[[Callable], Callable]:
    """Parametrize a test over `formats` (name), every dtype and TOKENS."""
    def decorate(test: Callable) -> Callable:
        for name, values in (("name", list(formats)), ("dtype", DTYPES), ("tokens", TOKENS)):
            test = pytest.mark.parametrize(name, values)(test)
        return test
    return decorate


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected.cpu(), **TOLERANCES[dtype])


@over(FP8_FORMATS)
def test_fp8_matches_the_reference(triton_device: torch.device, name: str, dtype: str, tokens: int) -> None:
    out_features, in_features, block, per_row, static, ue8m0, bound = FP8_FORMATS[name]
    x, w, bias = _inputs(triton_device, dtype, tokens, out_features, in_features)
    weight, scale = quantize_weight(w, block, ue8m0, per_row)
    input_scale = (x.float().abs().amax() / 448).reshape(()) if static else None
    spec = fp8_ref.Fp8LinearSpec(block, static, block[1] if block else None, ue8m0, bound)
    _close(quant_fp8_gemm.fp8_linear(x, weight, scale, input_scale, spec, bias),
           fp8_ref.fp8_linear(x, weight, scale, input_scale, spec, bias), dtype)


def test_fp8_three_dimensional_input_without_bias(triton_device: torch.device) -> None:
    x, w, _ = _inputs(triton_device, "fp32", 6, 72, 80)
    weight, scale = quantize_weight(w, (32, 32))
    spec = fp8_ref.Fp8LinearSpec((32, 32), False, 32)
    x = x.view(2, 3, 80)
    _close(quant_fp8_gemm.fp8_linear(x, weight, scale, None, spec), fp8_ref.fp8_linear(x, weight, scale, None, spec),
           "fp32")


# name -> (out, in, group, symmetric, W4A8)
INT4_FORMATS = {
    "g32": (72, 96, 32, False, False), "g32-sym": (72, 96, 32, True, False),
    "per-channel": (72, 104, 104, False, False), "g128": (40, 256, 128, False, False),
    "w4a8-g32": (72, 96, 32, False, True), "w4a8-per-channel-sym": (72, 104, 104, True, True),
}


@over(INT4_FORMATS)
def test_int4_matches_the_reference(triton_device: torch.device, name: str, dtype: str, tokens: int) -> None:
    out_features, in_features, group, sym, w4a8 = INT4_FORMATS[name]
    x, w, bias = _inputs(triton_device, dtype, tokens, out_features, in_features)
    q, scales, zeros = quantize_rtn(w, group, sym)
    weight, params = TRITON_INT4.prepare(q, scales, zeros, group, x.dtype)
    spec = Int4LinearSpec(group, w4a8)
    _close(TRITON_INT4(x, weight, params, spec, bias), TORCH_INT4(x, weight, params, spec, bias), dtype)


# name -> (out, in, format, W4A4, one global scale per row)
FP4_FORMATS = {
    "nvfp4": (72, 48, "nvfp4", False, False), "nvfp4-row-global": (72, 48, "nvfp4", False, True),
    "nvfp4-w4a4": (72, 80, "nvfp4", True, True), "mxfp4": (72, 96, "mxfp4", False, False),
}


@over(FP4_FORMATS)
def test_fp4_matches_the_reference(triton_device: torch.device, name: str, dtype: str, tokens: int) -> None:
    out_features, in_features, fmt, w4a4, row_global = FP4_FORMATS[name]
    x, w, bias = _inputs(triton_device, dtype, tokens, out_features, in_features)
    weight_global = input_global = None
    if fmt == "mxfp4":
        weight, scale = mxfp4_quantize(w)
    elif row_global:  # merged layers keep one per-tensor scale per row, each matrix quantized under its own
        halves = [nvfp4_quantize(part) for part in w.chunk(2)]
        weight, scale = torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])
        weight_global = torch.cat([h[2].expand(out_features // 2) for h in halves]).reshape(-1, 1)
    else:
        weight, scale, weight_global = nvfp4_quantize(w)
        weight_global = weight_global.reshape(1, 1)
    if w4a4:
        input_global = nvfp4_global_scale(x.float().abs().amax())
    spec = fp4_ref.Fp4LinearSpec(fmt, "nvfp4" if w4a4 else "none")
    args = (x, weight, scale, weight_global, input_global, spec, bias)
    _close(quant_fp4_gemm.fp4_linear(*args), fp4_ref.fp4_linear(*args), dtype)


def test_every_mxfp4_scale_and_fp4_code_decodes_as_the_reference(triton_device: torch.device) -> None:
    """Every byte as a weight pair and e8m0 scales across the range (incl. the subnormal 2^-127 of e = 0),
    times one-hot inputs: each output column is one dequantized weight, exactly."""
    weight = torch.arange(256, dtype=torch.int32, device=triton_device).to(torch.uint8).view(16, 16)  # [16, 32 codes]
    scale = torch.tensor([0, 1, 60, 100, 120, 126, 127, 128, 130, 135, 140, 150, 160, 127, 127, 127],
                         dtype=torch.uint8, device=triton_device).view(16, 1)
    x = torch.eye(32, device=triton_device)
    spec = fp4_ref.Fp4LinearSpec("mxfp4")
    expected = fp4_ref.fp4_linear(x, weight, scale, None, None, spec)
    assert torch.equal(quant_fp4_gemm.fp4_linear(x, weight, scale, None, None, spec), expected)


def test_every_fp8_byte_decodes_as_the_reference(triton_device: torch.device) -> None:
    finite = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    finite = finite[~finite.float().isnan()].to(triton_device)
    weight = finite[:252].view(4, 63)  # 252 of the 254 non-NaN bytes, one output row per 63
    x = torch.eye(63, device=triton_device)
    scale = torch.tensor([[0.5], [1.0], [2.0 ** -7], [3.0]], device=triton_device)
    spec = fp8_ref.Fp8LinearSpec(None, True)
    one = torch.tensor(1.0, device=triton_device)  # one-hot inputs pass a static fp8 scale of 1 unchanged
    assert torch.equal(quant_fp8_gemm.fp8_linear(x, weight, scale, one, spec),
                       fp8_ref.fp8_linear(x, weight, scale, one, spec))


def test_mismatched_shapes_are_refused() -> None:
    x = torch.randn(2, 64)
    weight, scale = quantize_weight(torch.randn(40, 64), (32, 32))
    with pytest.raises(ValueError, match="block scales"):
        quant_fp8_gemm.fp8_linear(x, weight, scale[:, :1], None, fp8_ref.Fp8LinearSpec((32, 32), False, 32))
    with pytest.raises(ValueError, match="x has 48 features"):
        quant_fp8_gemm.fp8_linear(x[:, :48], weight, scale, None, fp8_ref.Fp8LinearSpec((32, 32), False, 32))
    packed, scales = mxfp4_quantize(torch.randn(40, 64))
    with pytest.raises(ValueError, match="mxfp4 scales"):
        quant_fp4_gemm.fp4_linear(x, packed, scales[:, :1], None, None, fp4_ref.Fp4LinearSpec("mxfp4"))
    q, group_scales, zeros = quantize_rtn(torch.randn(40, 64), 32, False)
    weight, params = TRITON_INT4.prepare(q, group_scales, zeros, 32, x.dtype)
    with pytest.raises(ValueError, match="int4_linear"):
        TRITON_INT4(x[:, :32], weight, params, Int4LinearSpec(32, False))


@pytest.mark.parametrize(("op", "fn"), [("fp8_linear", quant_fp8_gemm.fp8_linear),
                                        ("int4_linear", TRITON_INT4), ("fp4_linear", quant_fp4_gemm.fp4_linear)])
def test_registered_as_the_cuda_default_and_skipped_on_cpu(op: str, fn: object) -> None:
    assert REGISTRY.implementation(op, "triton", "cuda", "bfloat16").fn is fn
    assert REGISTRY.backends()[op][0] == "triton"
    assert REGISTRY.select(op, "cpu", "bfloat16").backend != "triton"
