"""The cpu_cpp silu_and_mul on bf16 rows equals torch_ref bit for bit: the AVX-512 BF16 form (csrc/silu_bf16.h)
where the CPU has it, else the scalar form. Widths past one 16-lane vector and short of it (the masked tail),
strided rows, and the edges: overflowing e^-x, infinities, NaN (any NaN), signed zero."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.activation import silu_and_mul as reference
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS

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
