"""The cpu_cpp apply_token_bitmask kernel against the reference at edges the numerics matrix does not reach:
vocabularies that are not a multiple of 32 (a partial last word), a bitmask wider than the logits, rows that
are slices of a wider tensor, and words of every kind (all ones, all zeros, mixed, the sign bit alone)."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.token_bitmask import apply_token_bitmask, apply_token_bitmask_cpu_cpp

pytestmark = pytest.mark.skipif(CPU_OPS.skip_reason() is not None, reason=f"C++ extension: {CPU_OPS.skip_reason()}")


def _bitmask(rows: int, words: int, generator: torch.Generator) -> torch.Tensor:
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), generator=generator, dtype=torch.int64).to(torch.int32)
    bitmask[0] = -1
    bitmask[1, ::2] = 0
    bitmask[2, ::3] = -(2**31)  # only bit 31 set
    return bitmask


@pytest.mark.parametrize("vocab_size", [1, 31, 33, 100, 8190, 8192])
def test_matches_reference(vocab_size: int) -> None:
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(5, vocab_size, generator=generator)
    bitmask = _bitmask(5, (vocab_size + 31) // 32 + 1, generator)  # one word more than needed
    expected = apply_token_bitmask(logits.clone(), bitmask)
    assert torch.equal(apply_token_bitmask_cpu_cpp(logits.clone(), bitmask), expected)


def test_rows_of_a_wider_tensor() -> None:
    generator = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 300, generator=generator)
    logits = wide[:, :257]  # row stride 300, unit last stride
    bitmask = _bitmask(4, 9, generator)
    expected = apply_token_bitmask(logits.clone(), bitmask)
    apply_token_bitmask_cpu_cpp(logits, bitmask)
    assert torch.equal(logits, expected)
    assert torch.isfinite(wide[:, 257:]).all()  # nothing written past the logits


def test_refuses_a_bitmask_too_narrow() -> None:
    with pytest.raises(RuntimeError, match="does not cover logits"):
        apply_token_bitmask_cpu_cpp(torch.zeros(2, 65), torch.full((2, 2), -1, dtype=torch.int32))
