"""The linear kernels over amx_pack_weight's layout against F.linear in fp32: `cpu_amx` (its three paths: one
row, up to 16 rows, 32-row blocks with a padded tail) and `cpu_avx512` (1-12-row micro-kernels over 4- and
2-block groups, 96-row panels); bias, the fallback for widths that are not multiples of 32, and the layout
check. Each skips where the CPU or OS does not run its code (AMX-BF16, AVX512-BF16)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rapid_llm.ops.amx_linear import AMX_LINEAR, PackedLinear, amx_missing
from rapid_llm.ops.avx512_linear import AVX512_LINEAR, avx512_missing
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS

KERNELS = [pytest.param(AMX_LINEAR, id="cpu_amx", marks=pytest.mark.skipif(
               amx_missing("cpu", "bfloat16") is not None, reason=f"cpu_amx: {amx_missing('cpu', 'bfloat16')}")),
           pytest.param(AVX512_LINEAR, id="cpu_avx512", marks=pytest.mark.skipif(
               avx512_missing("cpu", "bfloat16") is not None,
               reason=f"cpu_avx512: {avx512_missing('cpu', 'bfloat16')}"))]


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest) -> PackedLinear:
    return request.param


def _case(rows: int, in_features: int, out_features: int, bias: bool) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(rows * 7 + in_features + out_features)
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    weight = (torch.randn(out_features, in_features, generator=generator) * in_features**-0.5).bfloat16()
    b = torch.randn(out_features, generator=generator).bfloat16() if bias else None
    return x, weight, b


def _bf16_rounding_of_exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 32, 33, 100, 300])
@pytest.mark.parametrize(("in_features", "out_features", "bias"), [(64, 32, False), (256, 96, True), (96, 512, False)])
def test_matches_the_exact_product_within_one_bf16_rounding(kernel: PackedLinear, rows: int, in_features: int,
                                                           out_features: int, bias: bool) -> None:
    x, weight, b = _case(rows, in_features, out_features, bias)
    got = kernel(x, kernel.prepare(weight), b)
    exact = _bf16_rounding_of_exact(x, weight, b)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # fp32 sums in another order, then one rounding: within an ulp of bf16 plus fp32's summation error.
    torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-4)
    oneDNN = F.linear(x, weight, b)
    assert (got.float() - oneDNN.float()).abs().max() <= (oneDNN.float().abs().max() * 2**-7).item()


@pytest.mark.parametrize("rows", [1, 6, 96, 97, 200])
def test_one_thread_and_two_give_the_same_sums(kernel: PackedLinear, rows: int) -> None:
    """Calls of up to one panel of rows hand their output groups to threads as they free up, longer ones split
    them in fixed shares: either way each output's sums are the same whichever thread computes it."""
    x, weight, b = _case(rows, 256, 1024, True)
    packed = kernel.prepare(weight)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append((kernel(x, packed, b), kernel.silu_and_mul_linear(x, packed, b)))
    finally:
        torch.set_num_threads(threads)
    (plain_alone, gated_alone), (plain_shared, gated_shared) = results
    assert torch.equal(plain_alone, plain_shared) and torch.equal(gated_alone, gated_shared)
    torch.testing.assert_close(plain_alone.double(), _bf16_rounding_of_exact(x, weight, b), rtol=2**-8, atol=1e-4)


def test_leading_dimensions_are_kept(kernel: PackedLinear) -> None:
    x, weight, _ = _case(6, 64, 64, False)
    got = kernel(x.view(2, 3, 64), kernel.prepare(weight))
    assert got.shape == (2, 3, 64)
    torch.testing.assert_close(got.view(6, 64), kernel(x, kernel.prepare(weight)), rtol=0, atol=0)


def test_widths_not_multiples_of_32_keep_onednn_format(kernel: PackedLinear) -> None:
    x, weight, b = _case(3, 88, 40, True)
    prepared = kernel.prepare(weight)
    assert prepared.is_mkldnn
    torch.testing.assert_close(kernel(x, prepared, b), F.linear(x, weight, b), rtol=0, atol=0)
    torch.testing.assert_close(kernel(x, weight, b), F.linear(x, weight, b), rtol=0, atol=0)


def test_a_weight_not_from_the_packer_is_refused(kernel: PackedLinear) -> None:
    x, _, _ = _case(1, 64, 32, False)
    call = getattr(CPU_OPS.load(), kernel.kernel)
    with pytest.raises(RuntimeError, match="amx_pack_weight"):
        call(x, torch.zeros(2, 32, 16, dtype=torch.bfloat16), None)
    with pytest.raises(RuntimeError, match="amx_pack_weight"):  # 16 inputs: not whole 32-input steps
        call(torch.zeros(1, 16, dtype=torch.bfloat16), torch.zeros(2, 8, 32, dtype=torch.bfloat16), None)


def test_no_rows_and_bad_bias(kernel: PackedLinear) -> None:
    _, weight, _ = _case(1, 64, 64, False)
    packed = kernel.prepare(weight)
    assert kernel(torch.empty(0, 64, dtype=torch.bfloat16), packed).shape == (0, 64)
    with pytest.raises(RuntimeError, match="bias must be"):
        getattr(CPU_OPS.load(), kernel.kernel)(torch.zeros(2, 64, dtype=torch.bfloat16), packed, torch.zeros(1))


def test_packed_shapes_the_packer_cannot_make_are_refused(kernel: PackedLinear) -> None:
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="amx_pack_weight"):  # 48 outputs: not whole 32-output tiles
        getattr(CPU_OPS.load(), kernel.kernel)(x, torch.zeros(3, 32, 32, dtype=torch.bfloat16), None)
