"""The Triton MLA backend against naive MLA and torch_ref.

Batches mix decodes, fresh prefills and chunks after cached context with lengths unaligned to the block size
(3), a prefill of more rows than one tile and contexts longer than one key tile, through
tests/kernels/test_attention_mla.py's two-step setup. On CPU the kernel runs under Triton's interpreter
(tests/kernels/conftest.py); `-m gpu` on CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.ops.attention.mla_torch_ref import MLA_TORCH_REF_BACKEND  # noqa: E402
from rapid_llm.ops.attention.mla_triton import TRITON_MLA_BACKEND  # noqa: E402
from tests.kernels import test_attention_mla as mla  # noqa: E402

MIXED = [(9, 1), (0, 13), (5, 4), (40, 1), (0, 1), (20, 6)]  # 13 tokens x 3 heads: more rows than a tile
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 5e-2}  # as torch_ref / torch_absorbed meet in test_attention_mla


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shapes", [MIXED, [(4, 1), (7, 1), (33, 1)], [(0, 1)], [(0, 5)], [(6, 9), (0, 2)]],
                         ids=["mixed", "decodes", "one-token", "prefill", "chunks"])
def test_matches_naive_mla_and_torch_ref(triton_device: torch.device, shapes: list[tuple[int, int]],
                                         dtype: torch.dtype) -> None:
    torch.manual_seed(len(shapes))
    output, expected, cache = mla._run(TRITON_MLA_BACKEND, shapes, dtype, triton_device)
    torch.manual_seed(len(shapes))  # the same inputs through the reference backend
    reference, _, reference_cache = mla._run(MLA_TORCH_REF_BACKEND, shapes, dtype)
    assert output.dtype == dtype and output.shape == reference.shape
    assert torch.equal(cache, reference_cache)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(output.float(), expected.float(), atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(output.float(), reference.float(), atol=tolerance, rtol=tolerance)
