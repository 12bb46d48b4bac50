"""The torch reference attention backend matches naive per-sequence causal attention."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND
from tests.kernels.attention_cases import run_mixed_batch


@pytest.mark.parametrize("window", [None, 5])
def test_mixed_batch_matches_naive_attention(window: int | None) -> None:
    torch.manual_seed(0)
    # (context already cached, new tokens): a decode, a fresh prefill, a chunk after cached tokens.
    output, expected = run_mixed_batch(TORCH_REF_BACKEND, [(9, 1), (0, 7), (5, 4), (12, 1)], window=window)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


def test_metadata_positions_and_slots() -> None:
    layout = StepLayout(query_lens=[2, 1], seq_lens=[5, 4], block_tables=[[7, 2], [4, 9]], block_size=3)
    metadata = TORCH_REF_BACKEND.build_metadata(layout, torch.device("cpu"))
    assert metadata.positions.tolist() == [3, 4, 3]
    # position 3 -> block index 1, offset 0; position 4 -> offset 1
    assert metadata.slot_mapping.tolist() == [2 * 3 + 0, 2 * 3 + 1, 9 * 3 + 0]
