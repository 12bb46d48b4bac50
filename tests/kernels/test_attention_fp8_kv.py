"""FP8 (e4m3) KV cache in the torch_ref and cpu_paged backends: quantize/dequantize round trip, attention on the
fp8 cache against attention on its dequantized copy (tight) and against the unquantized cache (fp8 rounding)."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.attention import AttentionBackend, StepLayout
from rapid_llm.ops.attention.cpu_paged import CPU_PAGED_BACKEND
from rapid_llm.ops.attention.kv_quant import FP8_KV_DTYPE, KVScales, dequantize_kv, quantize_kv
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND
from rapid_llm.ops.cpp.cpu_ops import skip_reason

# (cached context, new tokens): decode, prefill, chunk, decode (cpu_paged: the kernel takes all but the prefill).
SHAPES = [(9, 1), (0, 7), (5, 4), (12, 1)]
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 16, 3


def test_round_trip_error_is_fp8_rounding_and_saturates() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 2, 16) * 3
    for scale in (1.0, 0.05):
        back = dequantize_kv(quantize_kv(x, scale), scale, torch.float32)
        # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 on normals (subnormals below 2**-6 * scale).
        assert ((back - x).abs() <= x.abs() * 2**-4 + 2**-9 * scale).all()
    big = quantize_kv(torch.tensor([1e4, -1e4, 500.0]), 1.0)
    assert big.dtype == FP8_KV_DTYPE and big.float().tolist() == [448.0, -448.0, 448.0]  # not NaN


def _run(backend: AttentionBackend, kv_dtype: torch.dtype, scales: KVScales | None, keys: list[torch.Tensor], values: list[torch.Tensor],
         queries: torch.Tensor, tables: list[list[int]], num_blocks: int, window: int | None) -> torch.Tensor:
    """Prefill every sequence's context, then one mixed step; returns the step's output and the cache."""
    cpu = torch.device("cpu")
    kv_cache = torch.zeros(2, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=kv_dtype)
    extra = {} if scales is None else {"kv_scales": scales}
    cached = [i for i, (c, _) in enumerate(SHAPES) if c]
    prefill = StepLayout([SHAPES[i][0] for i in cached], [SHAPES[i][0] for i in cached], [tables[i] for i in cached],
                         BLOCK_SIZE)
    ctx_k = torch.cat([keys[i][: SHAPES[i][0]] for i in cached])
    ctx_v = torch.cat([values[i][: SHAPES[i][0]] for i in cached])
    backend.forward(torch.zeros(len(ctx_k), HEADS, HEAD_DIM), ctx_k, ctx_v, kv_cache,
                              backend.build_metadata(prefill, cpu), 0.3, window, **extra)
    layout = StepLayout([n for _, n in SHAPES], [c + n for c, n in SHAPES], tables, BLOCK_SIZE)
    new_k = torch.cat([k[c:] for k, (c, _) in zip(keys, SHAPES)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(values, SHAPES)])
    return backend.forward(queries, new_k, new_v, kv_cache, backend.build_metadata(layout, cpu),
                                     0.3, window, **extra)


UNAVAILABLE = skip_reason("cpu", "float32")
BACKENDS = [TORCH_REF_BACKEND, pytest.param(CPU_PAGED_BACKEND, marks=pytest.mark.skipif(UNAVAILABLE is not None,
                                                                                   reason=str(UNAVAILABLE)))]


@pytest.mark.parametrize("backend", BACKENDS, ids=["torch_ref", "cpu_paged"])
@pytest.mark.parametrize("window", [None, 5])
def test_fp8_cache_attention_equals_attention_on_its_dequantized_values(backend: AttentionBackend,
                                                                        window: int | None) -> None:
    torch.manual_seed(0)
    num_blocks = sum(-(-(c + n) // BLOCK_SIZE) for c, n in SHAPES) + 2
    free = torch.randperm(num_blocks).tolist()
    tables = [[free.pop() for _ in range(-(-(c + n) // BLOCK_SIZE))] for c, n in SHAPES]
    scales = KVScales(k_scale=0.05, v_scale=0.01)  # |K| <= 22.4, |V| <= 4.48 in range; both must be used
    keys = [torch.randn(c + n, KV_HEADS, HEAD_DIM) * 2 for c, n in SHAPES]
    values = [torch.randn(c + n, KV_HEADS, HEAD_DIM) / 4 for c, n in SHAPES]
    queries = torch.randn(sum(n for _, n in SHAPES), HEADS, HEAD_DIM)
    fp8 = _run(backend, FP8_KV_DTYPE, scales, keys, values, queries, tables, num_blocks, window)
    # The same attention over the values an fp8 cache can hold, kept in an fp32 cache.
    dequant_k = [dequantize_kv(quantize_kv(k, scales.k_scale), scales.k_scale, torch.float32) for k in keys]
    dequant_v = [dequantize_kv(quantize_kv(v, scales.v_scale), scales.v_scale, torch.float32) for v in values]
    reference = _run(backend, torch.float32, None, dequant_k, dequant_v, queries, tables, num_blocks, window)
    torch.testing.assert_close(fp8, reference, atol=2e-6, rtol=2e-6)
    exact = _run(backend, torch.float32, None, keys, values, queries, tables, num_blocks, window)
    error = (fp8 - exact).abs().max().item()
    assert error < 0.05, error
