"""The padded prefill group's `is_causal` path (fresh prompts, no window) equals its explicit-mask path and naive attention.

The cache is filled with random values everywhere, block-table padding included, so a padding key that leaked
into a real query row would change the result.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.attention.kv_quant import FP8_KV_DTYPE, KVScales, dequantize_kv, quantize_kv
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND, attend_padded_group
from tests.kernels.attention_cases import naive_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE = 4, 2, 16, 4, 0.3
K_SCALE, V_SCALE = 0.02, 0.03


def _attend(shapes: list[tuple[int, int]], dtype: torch.dtype, kv_dtype: torch.dtype, window: int | None,
            force_mask: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One prefill group of (cached context, new tokens) sequences: (output, naive reference, took is_causal)."""
    torch.manual_seed(0)
    num_blocks = sum(-(-(c + n) // BLOCK_SIZE) for c, n in shapes) + 2
    history = torch.randn(2, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    scales = None
    if kv_dtype == FP8_KV_DTYPE:
        scales = KVScales(K_SCALE, V_SCALE)
        kv_cache = torch.stack([quantize_kv(history[0], K_SCALE), quantize_kv(history[1], V_SCALE)])
        history = torch.stack([dequantize_kv(kv_cache[0], K_SCALE, torch.float32),
                               dequantize_kv(kv_cache[1], V_SCALE, torch.float32)])
    else:
        kv_cache = history.to(kv_dtype)
        history = kv_cache.float()
    free = torch.randperm(num_blocks).tolist()
    tables = [[free.pop() for _ in range(-(-(c + n) // BLOCK_SIZE))] for c, n in shapes]
    layout = StepLayout([n for _, n in shapes], [c + n for c, n in shapes], tables, BLOCK_SIZE)
    query = torch.randn(layout.num_tokens, HEADS, HEAD_DIM).to(dtype)
    (group,) = TORCH_REF_BACKEND.build_metadata(layout, torch.device("cpu")).groups
    if force_mask:
        group = replace(group, fresh=False)
    output = torch.zeros_like(query)
    attend_padded_group(output, query, kv_cache, group, SCALE, window, scales)
    expected, start = [], 0
    for (context, new), table in zip(shapes, tables):
        keys, values = (history[i][table].flatten(0, 1)[: context + new] for i in (0, 1))
        expected.append(naive_attention(query[start : start + new].float(), keys, values, context, SCALE, window))
        start += new
    return output, torch.cat(expected), group.causal_only(window)


# One fresh prompt; several of different lengths (padding rows and keys); one long enough for several kernel blocks.
FRESH = [[(0, 7)], [(0, 9), (0, 3), (0, 6)], [(0, 300), (0, 130)]]


@pytest.mark.parametrize("shapes", FRESH)
def test_fresh_group_takes_is_causal_and_matches_mask_path_fp32(shapes: list[tuple[int, int]]) -> None:
    output, expected, causal = _attend(shapes, torch.float32, torch.float32, None, force_mask=False)
    masked, _, masked_causal = _attend(shapes, torch.float32, torch.float32, None, force_mask=True)
    assert causal and not masked_causal
    torch.testing.assert_close(output, masked, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes", FRESH)
def test_fresh_group_bf16_and_fp8_kv(shapes: list[tuple[int, int]]) -> None:
    # bf16 inputs and output, fp32 accumulation: the result's own rounding (2**-8 relative) plus the inputs'.
    for dtype, kv_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, FP8_KV_DTYPE)):
        output, expected, causal = _attend(shapes, dtype, kv_dtype, None, force_mask=False)
        masked, _, _ = _attend(shapes, dtype, kv_dtype, None, force_mask=True)
        assert causal
        tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(output.float(), masked.float(), atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(output.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("shapes, window", [
    ([(0, 9), (0, 3)], 4),  # a sliding window needs the mask
    ([(0, 9), (6, 5)], None),  # a group mixing fresh and cached sequences: keys do not share query positions
    ([(5, 8)], None),  # a chunk after cached context
])
def test_mask_path_stays_where_is_causal_is_not_exact(shapes: list[tuple[int, int]], window: int | None) -> None:
    output, expected, causal = _attend(shapes, torch.float32, torch.float32, window, force_mask=False)
    assert not causal
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
