"""The tiled prefill attention kernel (csrc/prefill_attention.cpp) matches naive float64 attention.

Odd shapes on purpose: chunks that are not a multiple of the query or key tile, cached context before the
chunk, groups of 1, 3 and 8 query heads per kv head, every head dim the kernel takes, block sizes that do not
divide the key tile, sliding windows shorter than a tile and crossing tiles, an fp8 cache with scales, and
decodes in the same step that the kernel must leave alone. Each case runs both forms of the products:
AVX-512 BF16 dot products and AMX tiles (where the CPU has AMX; head dims not a multiple of 32 fall back).
"""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.amx_linear import amx_missing
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS, skip_reason
from tests.kernels.attention_cases import naive_attention

UNAVAILABLE = skip_reason("cpu", "bfloat16")
HEAD_DIMS: tuple[int, ...] = () if UNAVAILABLE else tuple(CPU_OPS.load().prefill_attention_head_dims())
pytestmark = pytest.mark.skipif(not HEAD_DIMS, reason=str(UNAVAILABLE or "this CPU lacks AVX-512 BF16 "
                                                           "(prefill_attention_head_dims() is empty)"))
BF16_TOLERANCE = 1e-2  # bf16 inputs and probabilities, fp32 accumulation, against float64
AMX_MISSING = UNAVAILABLE or amx_missing("cpu", "bf16")
FORMS = ["avx512", pytest.param("amx", marks=pytest.mark.skipif(AMX_MISSING is not None, reason=str(AMX_MISSING)))]


def _run(shapes: list[tuple[int, int]], *, heads: int, kv_heads: int, head_dim: int, block_size: int,
         window: int | None = None, fp8_scales: tuple[float, float] | None = None, threads: int | None = None,
         form: str = "avx512") -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """shapes: per sequence (cached context, new tokens); the kernel computes those with more than one new
    token. Returns (output, naive, rows the kernel computed)."""
    num_blocks = sum(-(-(c + n) // block_size) for c, n in shapes) + 2
    free = torch.randperm(num_blocks).tolist()
    tables = [[free.pop() for _ in range(-(-(c + n) // block_size))] for c, n in shapes]
    width = max(len(table) for table in tables)
    block_tables = torch.tensor([table + [0] * (width - len(table)) for table in tables], dtype=torch.int64)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim)
    k_scale, v_scale = fp8_scales or (1.0, 1.0)
    if fp8_scales:
        stored = torch.stack([cache[0] / k_scale, cache[1] / v_scale]).to(torch.float8_e4m3fn)
        cache = torch.stack([stored[0].float() * k_scale, stored[1].float() * v_scale])
    else:
        stored = cache.to(torch.bfloat16)
        cache = stored.float()
    lens = [n for _, n in shapes]
    query = torch.randn(sum(lens), heads, head_dim).to(torch.bfloat16)
    query_start = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
    seq_lens = torch.tensor([c + n for c, n in shapes], dtype=torch.int64)
    chunk_ids = [i for i, n in enumerate(lens) if n > 1]
    output = torch.zeros_like(query)
    scale = head_dim ** -0.5
    previous = torch.get_num_threads()
    torch.set_num_threads(threads or previous)
    try:
        CPU_OPS.load().prefill_attention(output, query, stored, query_start, seq_lens, block_tables,
                                         torch.tensor(chunk_ids, dtype=torch.int64), scale, window or 0,
                                         k_scale, v_scale, form == "amx")
    finally:
        torch.set_num_threads(previous)
    expected, rows = torch.zeros(query.shape), []
    for i in chunk_ids:
        context, new = shapes[i]
        slots = [tables[i][p // block_size] * block_size + p % block_size for p in range(context + new)]
        flat = cache.flatten(1, 2)
        begin, end = int(query_start[i]), int(query_start[i + 1])
        expected[begin:end] = naive_attention(query[begin:end], flat[0, slots], flat[1, slots], context, scale, window)
        rows.extend(range(begin, end))
    return output, expected, rows


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (8, 1)])
def test_fresh_prompts_and_chunks_after_context(head_dim: int, heads: int, kv_heads: int, form: str) -> None:
    torch.manual_seed(head_dim + heads)
    shapes = [(0, 150), (37, 1), (300, 70), (0, 2), (5, 129)]
    output, expected, rows = _run(shapes, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=16,
                                  form=form)
    torch.testing.assert_close(output[rows].float(), expected[rows], atol=BF16_TOLERANCE, rtol=BF16_TOLERANCE)
    decode_row = 150  # the (37, 1) decode: not the kernel's, left as it was
    assert output[decode_row].abs().sum() == 0


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("block_size", [5, 16, 48])
@pytest.mark.parametrize("window", [None, 7, 100])
def test_block_sizes_and_sliding_windows(block_size: int, window: int | None, form: str) -> None:
    torch.manual_seed(block_size)
    shapes = [(0, 200), (130, 41)]
    output, expected, rows = _run(shapes, heads=6, kv_heads=2, head_dim=64, block_size=block_size, window=window,
                                  form=form)
    torch.testing.assert_close(output[rows].float(), expected[rows], atol=BF16_TOLERANCE, rtol=BF16_TOLERANCE)


@pytest.mark.parametrize("form", FORMS)
def test_fp8_cache_with_scales(form: str) -> None:
    torch.manual_seed(7)
    output, expected, rows = _run([(90, 60), (0, 33)], heads=4, kv_heads=2, head_dim=32, block_size=16,
                                  fp8_scales=(0.02, 0.5), form=form)
    torch.testing.assert_close(output[rows].float(), expected[rows], atol=BF16_TOLERANCE, rtol=BF16_TOLERANCE)


@pytest.mark.parametrize("form", FORMS)
def test_thread_count_does_not_change_the_result(form: str) -> None:
    """Each (sequence, kv head, query tile) item is computed by one thread: bit-identical output."""
    results = []
    for threads in (1, 2):
        torch.manual_seed(9)
        results.append(_run([(64, 300), (0, 90)], heads=6, kv_heads=3, head_dim=32, block_size=16,
                            threads=threads, form=form)[0])
    assert torch.equal(results[0], results[1])


def test_rejects_what_it_cannot_compute() -> None:
    query = torch.zeros(4, 2, 48, dtype=torch.bfloat16)
    cache = torch.zeros(2, 1, 16, 2, 48, dtype=torch.bfloat16)
    meta = (torch.tensor([0, 4]), torch.tensor([4]), torch.zeros(1, 1, dtype=torch.int64), torch.tensor([0]))
    with pytest.raises(RuntimeError, match="head_dim 48"):
        CPU_OPS.load().prefill_attention(torch.empty_like(query), query, cache, *meta, 1.0, 0, 1.0, 1.0, False)
    with pytest.raises(RuntimeError, match="bf16 query"):
        CPU_OPS.load().prefill_attention(torch.empty_like(query.float()), query.float(), cache.float(), *meta,
                                         1.0, 0, 1.0, 1.0, False)
