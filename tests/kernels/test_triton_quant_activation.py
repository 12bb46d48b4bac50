"""The Triton activation fake quantization (FP8 per token / group / static, ue8m0, amax bound; int8 per token;
NVFP4 per 16) against the torch references, bit for bit in fp32 (same scales, IEEE divisions, same roundings);
in bf16 / fp16 within one step of the dtype (Triton's interpreter truncates fp32 -> bf16; the reference rounds).
Also the e4m3 rounding on the values where it carries into the exponent, ties, subnormals and saturation."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.config.dtypes import dtype_from_name  # noqa: E402
from rapid_llm.ops.triton import quant_activation  # noqa: E402
from rapid_llm.quantization.fp4_math import nvfp4_fake_quantize, nvfp4_global_scale  # noqa: E402
from rapid_llm.quantization.fp8_math import fake_quantize_activation  # noqa: E402
from rapid_llm.quantization.int4_math import fake_quantize_int8_per_token  # noqa: E402

DTYPES = ["fp32", "bf16", "fp16"]
ONE_STEP = {"bf16": {"atol": 1e-5, "rtol": 2**-7}, "fp16": {"atol": 1e-5, "rtol": 2**-10}}


def _check(actual: torch.Tensor, expected: torch.Tensor, dtype: str) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if dtype == "fp32":
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual.cpu(), expected.cpu(), **ONE_STEP[dtype])


def _x(device: torch.device, dtype: str, *shape: int) -> torch.Tensor:
    torch.manual_seed(sum(shape))
    x = torch.randn(*shape, device=device) * 3
    x[0, :5] = torch.tensor([0.0, -0.0, 1e-30, 900.0, -2.5])  # zero, a tiny value, an outlier
    return x.to(dtype_from_name(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("group", "ue8m0", "bound"), [(None, False, None), (32, False, None), (32, True, None),
                                                      (128, True, None), (None, False, 2.0), (7, False, None)])
@pytest.mark.parametrize("tokens", [1, 9])
def test_fp8_dynamic(triton_device: torch.device, tokens: int, group: int | None, ue8m0: bool, bound: float | None,
                     dtype: str) -> None:
    x = _x(triton_device, dtype, tokens, 80)  # 80: the last group of 32 (and 7) is partial
    _check(quant_activation.fake_quantize_fp8(x, group, None, ue8m0, bound),
           fake_quantize_activation(x, group, None, ue8m0, bound), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_static_saturates_at_448(triton_device: torch.device, dtype: str) -> None:
    x = _x(triton_device, dtype, 5, 1100)  # wider than one 1024-element chunk
    scale = torch.tensor(0.5, device=triton_device)  # 900 / 0.5 saturates
    _check(quant_activation.fake_quantize_fp8(x, None, scale), fake_quantize_activation(x, None, scale), dtype)


def test_e4m3_rounding_at_ties_carries_and_subnormals(triton_device: torch.device) -> None:
    """A static scale of 1 passes the values straight to the e4m3 rounding: midpoints between neighbours (ties to
    even), values just under a power of two (the rounding carries into the exponent), subnormals, 448 +- a bit."""
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite() & (grid >= 0)].sort().values
    midpoints = (grid[1:] + grid[:-1]) / 2
    values = torch.cat([midpoints, midpoints.nextafter(torch.tensor(0.0)), midpoints.nextafter(torch.tensor(1e9)),
                        torch.tensor([447.9, 448.0, 449.0, 1e-9, 2.0**-9, 3 * 2.0**-10])])
    x = torch.cat([values, -values]).reshape(2, -1).to(triton_device)
    one = torch.tensor(1.0, device=triton_device)
    assert torch.equal(quant_activation.fake_quantize_fp8(x, None, one), fake_quantize_activation(x, None, one))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 9])
def test_int8_per_token(triton_device: torch.device, tokens: int, dtype: str) -> None:
    x = _x(triton_device, dtype, tokens, 72)
    _check(quant_activation.fake_quantize_int8(x), fake_quantize_int8_per_token(x), dtype)


def test_int8_rounds_half_to_even(triton_device: torch.device) -> None:
    """amax 127 makes the scale 1, so x / scale is x: the .5 values are ties."""
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 126.5]], device=triton_device)
    assert torch.equal(quant_activation.fake_quantize_int8(x), fake_quantize_int8_per_token(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 9])
def test_nvfp4(triton_device: torch.device, tokens: int, dtype: str) -> None:
    x = _x(triton_device, dtype, tokens, 80)
    global_scale = nvfp4_global_scale(x.float()[:, 5:].abs().amax())  # the outlier saturates its group
    _check(quant_activation.fake_quantize_nvfp4(x, global_scale), nvfp4_fake_quantize(x, global_scale), dtype)


def test_bad_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        quant_activation.fake_quantize_nvfp4(torch.randn(2, 40), torch.tensor(1.0))
    with pytest.raises(ValueError, match="group must be positive"):
        quant_activation.fake_quantize_fp8(torch.randn(2, 40), 0, None)
