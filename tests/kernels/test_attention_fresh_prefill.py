"""The padded prefill group's fast paths equal its explicit-mask path and naive attention.

`is_causal` for fresh prompts without a window; on the CPU, chunks after cached context split at the
context boundary (`context_split.py`); everything else keeps the mask. The cache is filled with random
values everywhere, block-table padding included, so a padding key that leaked into a real query row
would change the result.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from unittest import mock

import pytest
import torch

from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.attention.kv_quant import FP8_KV_DTYPE, KVScales, dequantize_kv, quantize_kv
from rapid_llm.ops.attention import torch_ref
from rapid_llm.ops.attention.context_split import splits_at_context
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND, attend_padded_group
from tests.kernels.attention_cases import naive_attention

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE = 4, 2, 16, 4, 0.3
K_SCALE, V_SCALE = 0.02, 0.03


def _attend(shapes: list[tuple[int, int]], dtype: torch.dtype, kv_dtype: torch.dtype, window: int | None,
            force_mask: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    """One prefill group of (cached context, new tokens) sequences: (output, naive reference, the path taken)."""
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
    path = ("causal" if group.causal_only(window)
            else "split" if splits_at_context(query.device, group.max_query_len, window) and not force_mask
            else "mask")
    output = torch.zeros_like(query)
    with mock.patch.object(torch_ref, "splits_at_context", lambda *args: False) if force_mask else contextlib.nullcontext():
        attend_padded_group(output, query, kv_cache, group, SCALE, window, scales)
    expected, start = [], 0
    for (context, new), table in zip(shapes, tables):
        keys, values = (history[i][table].flatten(0, 1)[: context + new] for i in (0, 1))
        expected.append(naive_attention(query[start : start + new].float(), keys, values, context, SCALE, window))
        start += new
    return output, torch.cat(expected), path


# One fresh prompt; several of different lengths (padding rows and keys); one long enough for several kernel blocks.
FRESH = [[(0, 7)], [(0, 9), (0, 3), (0, 6)], [(0, 300), (0, 130)]]
# Chunks after cached context, long enough to split: one; several mixed with a fresh prompt and a short chunk.
CACHED = [[(5, 70)], [(100, 80), (0, 90), (37, 64), (200, 5)], [(700, 300)]]
CASES = [(shapes, "causal") for shapes in FRESH] + [(shapes, "split") for shapes in CACHED]


@pytest.mark.parametrize("shapes, path", CASES)
def test_fast_path_matches_mask_path_and_naive_fp32(shapes: list[tuple[int, int]], path: str) -> None:
    output, expected, taken = _attend(shapes, torch.float32, torch.float32, None, force_mask=False)
    masked, _, masked_path = _attend(shapes, torch.float32, torch.float32, None, force_mask=True)
    assert taken == path and masked_path == "mask"
    torch.testing.assert_close(output, masked, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shapes, path", CASES)
def test_fast_path_bf16_and_fp8_kv(shapes: list[tuple[int, int]], path: str) -> None:
    # bf16 inputs and output, fp32 accumulation: the result's own rounding (2**-8 relative) plus the inputs'
    # (the split path rounds each half to bf16 before the merge).
    for dtype, kv_dtype in ((torch.bfloat16, torch.bfloat16), (torch.float32, FP8_KV_DTYPE)):
        output, expected, taken = _attend(shapes, dtype, kv_dtype, None, force_mask=False)
        masked, _, _ = _attend(shapes, dtype, kv_dtype, None, force_mask=True)
        assert taken == path
        tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(output.float(), masked.float(), atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(output.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("shapes, window", [
    ([(0, 9), (0, 3)], 4),  # a sliding window needs the mask
    ([(30, 80), (0, 70)], 16),
    ([(0, 9), (6, 5)], None),  # short chunks only: one padded masked call beats per-sequence calls
    ([(5, 8)], None),
])
def test_mask_path_stays_where_fast_paths_do_not_apply(shapes: list[tuple[int, int]], window: int | None) -> None:
    output, expected, taken = _attend(shapes, torch.float32, torch.float32, window, force_mask=False)
    assert taken == "mask"
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
