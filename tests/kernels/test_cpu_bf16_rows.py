"""The cpu_cpp row ops on bf16 against torch_ref: the AVX-512 BF16 forms (csrc/silu_bf16.h, rotary_bf16.h,
rms_norm_bf16.h) where the CPU has them, else the scalar forms. silu_and_mul and neox rotary equal torch_ref bit
for bit; the norms sum their squares in another order, so a value may differ by its last bf16 bit. Widths past
one 16-lane vector and short of it (the masked tails), strided rows, partial rotary, and silu's edges:
overflowing e^-x, infinities, NaN (any NaN), signed zero."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.activation import silu_and_mul as reference
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.norm import fused_add_rms_norm, rms_norm
from rapid_llm.ops.rotary import rotary_embedding

pytestmark = pytest.mark.skipif(CPU_OPS.skip_reason() is not None, reason=str(CPU_OPS.skip_reason()))


def _same_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bits, except that a NaN's sign and payload may differ."""
    assert actual.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(actual.isnan(), expected.isnan())
    numbers = ~expected.isnan()
    differ = actual[numbers].view(torch.int16) != expected[numbers].view(torch.int16)
    assert not differ.any(), f"{int(differ.sum())} of {actual.numel()} values differ"


@pytest.mark.parametrize("width", [1, 5, 16, 37, 1000, 1024])
@pytest.mark.parametrize("rows", [1, 7, 130])
def test_random_rows_equal_the_reference(rows: int, width: int) -> None:
    generator = torch.Generator().manual_seed(rows * 10_000 + width)
    x = (torch.randn(rows, 2 * width, generator=generator) * 4).bfloat16()
    _same_bits(CPU_OPS.load().silu_and_mul(x), reference(x))


def test_strided_rows_equal_the_reference() -> None:
    generator = torch.Generator().manual_seed(7)
    wide = (torch.randn(33, 2 * 40 + 6, generator=generator) * 3).bfloat16()
    x = wide[:, 3:3 + 2 * 40]
    _same_bits(CPU_OPS.load().silu_and_mul(x), reference(x))


def test_edge_values_equal_the_reference() -> None:
    edges = [-1e4, -100.0, -88.0, -50.0, -1e-30, -0.0, 0.0, 1e-30, 1.0, 50.0, 100.0, 1e4,
             float("inf"), float("-inf"), float("nan"), 3.0, -3.0]
    values = torch.tensor(edges)
    gate = values.repeat_interleave(len(edges))
    up = values.repeat(len(edges))  # every gate beside every up value
    x = torch.cat([gate, up]).reshape(1, -1).bfloat16()
    _same_bits(CPU_OPS.load().silu_and_mul(x), reference(x))


@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(32, 32), (64, 64), (64, 32), (40, 40), (80, 48), (128, 128)])
def test_neox_rotary_equals_the_reference(head_dim: int, rotary_dim: int) -> None:
    generator = torch.Generator().manual_seed(head_dim * 1000 + rotary_dim)
    tokens, query_heads, key_heads = 37, 6, 2
    angles = torch.rand(tokens, 1, rotary_dim // 2, generator=generator) * 6
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    query = torch.randn(tokens, query_heads * head_dim, generator=generator).bfloat16()
    key = torch.randn(tokens, key_heads * head_dim, generator=generator).bfloat16()
    actual = CPU_OPS.load().rotary_embedding(query, key, cos, sin, head_dim, rotary_dim, True)
    for got, expected in zip(actual, rotary_embedding(query, key, cos, sin, head_dim, rotary_dim, True)):
        _same_bits(got, expected)


def _within_one_bit(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal but for a few values a bit apart (another summation order of the squares; a last-bit difference of
    the normalised value can move the product with the weight by up to two bits)."""
    torch.testing.assert_close(actual, expected, rtol=2 ** -6, atol=0)
    assert int((actual != expected).sum()) <= actual.numel() // 1000


@pytest.mark.parametrize("hidden", [37, 256, 1000])
def test_rms_norms_equal_the_reference_but_for_the_order_of_squares(hidden: int) -> None:
    generator = torch.Generator().manual_seed(hidden)
    x = (torch.randn(300, hidden, generator=generator) * 3).bfloat16()
    residual = torch.randn(300, hidden, generator=generator).bfloat16()
    weight = (torch.rand(hidden, generator=generator) + 0.5).bfloat16()
    extension = CPU_OPS.load()
    _within_one_bit(extension.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6))
    out, summed = extension.fused_add_rms_norm(x, residual, weight, 1e-6)
    expected_out, expected_summed = fused_add_rms_norm(x, residual, weight, 1e-6)
    _same_bits(summed, expected_summed)
    _within_one_bit(out, expected_out)
