"""The Triton attention backend against the torch reference backend on mixed paged batches.

Batches mix decodes, fresh prefills and chunks after cached tokens with lengths unaligned to the
block size, a prefill longer than one query tile, and a decode over a long context that the
split-KV kernel cuts into several splits; with GQA, MHA and MQA head layouts and sliding windows.
On CPU the kernels run under Triton's interpreter (tests/kernels/conftest.py); `-m gpu` on CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.config.dtypes import dtype_from_name  # noqa: E402
from rapid_llm.ops.attention import StepLayout  # noqa: E402
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND  # noqa: E402
from rapid_llm.ops.attention.triton_backend import TritonAttentionBackend  # noqa: E402

BLOCK_SIZE, NUM_BLOCKS, HEAD_DIM, SCALE = 5, 120, 24, 0.3
TOLERANCE = {"fp32": {"atol": 1e-5, "rtol": 1e-5}, "bf16": {"atol": 2e-2, "rtol": 2e-2},
             "fp16": {"atol": 4e-3, "rtol": 4e-3}}
# (tokens already cached, new tokens): a decode, a 70-token prefill (two 64-query tiles), a chunk after
# cached tokens, a decode over 300 keys (several splits of 32), and a first token decoded alone.
MIXED = [(9, 1), (0, 70), (13, 4), (300, 1), (0, 1)]


def _run(shapes: list[tuple[int, int]], dtype: str, device: torch.device, heads: int, kv_heads: int,
         window: int | None, backend: TritonAttentionBackend) -> None:
    torch_dtype = dtype_from_name(dtype)
    free = torch.randperm(NUM_BLOCKS).tolist()
    tables = [[free.pop() for _ in range(-(-(cached + new) // BLOCK_SIZE))] for cached, new in shapes]
    layout = StepLayout([new for _, new in shapes], [cached + new for cached, new in shapes], tables, BLOCK_SIZE)
    # The cached history is whatever the cache holds: random rows stand in for earlier steps' K/V.
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, kv_heads, HEAD_DIM, device=device).to(torch_dtype)
    query = torch.randn(layout.num_tokens, heads, HEAD_DIM, device=device).to(torch_dtype)
    key, value = (torch.randn(layout.num_tokens, kv_heads, HEAD_DIM, device=device).to(torch_dtype)
                  for _ in range(2))
    expected_cache = cache.clone()
    expected = TORCH_REF_BACKEND.forward(query, key, value, expected_cache,
                                         TORCH_REF_BACKEND.build_metadata(layout, device), SCALE, window)
    output = backend.forward(query, key, value, cache, backend.build_metadata(layout, device), SCALE, window)
    assert torch.equal(cache, expected_cache)  # the step's K/V were written first
    assert output.dtype == query.dtype and output.shape == query.shape
    torch.testing.assert_close(output.cpu(), expected.cpu(), **TOLERANCE[dtype])


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (2, 2), (8, 1)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_mixed_batch_matches_the_torch_reference(triton_device: torch.device, dtype: str, heads: int,
                                                 kv_heads: int, window: int | None) -> None:
    torch.manual_seed(heads * 10 + kv_heads)
    backend = TritonAttentionBackend(min_split_len=32, max_splits=16)
    _run(MIXED, dtype, triton_device, heads, kv_heads, window, backend)


@pytest.mark.parametrize("shapes", [[(0, 1)], [(4, 1), (0, 1), (17, 1)], [(0, 3)], [(6, 9), (0, 2)]],
                         ids=["one-token", "decodes-only", "one-prefill", "prefills-only"])
def test_batches_of_one_kind(triton_device: torch.device, shapes: list[tuple[int, int]]) -> None:
    torch.manual_seed(len(shapes))
    _run(shapes, "fp32", triton_device, 4, 2, None, TritonAttentionBackend(min_split_len=8))


def test_a_window_longer_than_the_context_changes_nothing(triton_device: torch.device) -> None:
    torch.manual_seed(3)
    _run(MIXED, "fp32", triton_device, 4, 2, 10_000, TritonAttentionBackend(min_split_len=32))


def test_decode_splits_follow_the_longest_decode() -> None:
    backend = TritonAttentionBackend(min_split_len=32, max_splits=4)
    layout = StepLayout([1, 40, 1], [300, 40, 20], [[0] * 60, [0] * 8, [0] * 4], BLOCK_SIZE)
    metadata = backend.build_metadata(layout, torch.device("cpu"))
    assert (metadata.num_kv_splits, metadata.kv_split_len) == (4, 75)  # 300 keys over at most 4 splits
    assert metadata.decode_seq_ids.tolist() == [0, 2] and metadata.prefill_seq_ids.tolist() == [1]
    assert metadata.max_prefill_query_len == 40
    short = backend.build_metadata(StepLayout([1], [20], [[0] * 4], BLOCK_SIZE), torch.device("cpu"))
    assert (short.num_kv_splits, short.kv_split_len) == (1, 32)


def test_invalid_settings_are_refused(triton_device: torch.device) -> None:
    with pytest.raises(ValueError, match="min_split_len"):
        TritonAttentionBackend(min_split_len=0)
    backend = TritonAttentionBackend()
    layout = StepLayout([1], [1], [[0]], BLOCK_SIZE)
    cache = torch.zeros(2, 2, BLOCK_SIZE, 3, HEAD_DIM, device=triton_device)
    qkv = torch.zeros(1, 4, HEAD_DIM, device=triton_device)
    with pytest.raises(ValueError, match="multiple of the cache's 3 KV heads"):
        backend.forward(qkv, qkv[:, :3], qkv[:, :3], cache, backend.build_metadata(layout, triton_device), 1.0, None)
    with pytest.raises(ValueError, match="sliding_window must be at least 1"):
        backend.forward(qkv, qkv[:, :2], qkv[:, :2], cache[:, :, :, :2].contiguous(),
                        backend.build_metadata(layout, triton_device), 1.0, 0)
