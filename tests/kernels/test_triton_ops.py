"""The Triton elementwise ops against their torch references: rms_norm, fused_add_rms_norm,
silu_and_mul, rotary_embedding (neox, gpt-j, partial) and kv_cache_store.

On CPU they run under Triton's interpreter (tests/kernels/conftest.py), which rounds fp32 -> bf16 by
truncation, so bf16 is compared within two bf16 steps; on CUDA (`-m gpu`) the same tests run compiled.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.config.dtypes import dtype_from_name  # noqa: E402
from rapid_llm.ops import activation, norm, rotary  # noqa: E402
from rapid_llm.ops.attention.backend import write_kv_cache as reference_store  # noqa: E402
from rapid_llm.ops.triton import activation as triton_activation  # noqa: E402
from rapid_llm.ops.triton import kv_cache as triton_kv_cache  # noqa: E402
from rapid_llm.ops.triton import norm as triton_norm  # noqa: E402
from rapid_llm.ops.triton import rotary as triton_rotary  # noqa: E402

DTYPES = ["fp32", "bf16", "fp16"]
TOKENS = [1, 7, 33]  # one token, and counts unaligned to any power-of-two tile
TOLERANCE = {"fp32": {"atol": 1e-5, "rtol": 1e-5}, "bf16": {"atol": 2e-2, "rtol": 2e-2},
             "fp16": {"atol": 4e-3, "rtol": 4e-3}}


def _close(actual: Any, expected: Any, dtype: str) -> None:
    actual = actual if isinstance(actual, tuple) else (actual,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want.cpu(), **TOLERANCE[dtype])


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(triton_device: torch.device, dtype: str, tokens: int) -> None:
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 96, dtype=dtype_from_name(dtype), device=triton_device)
    weight = torch.randn(96, dtype=x.dtype, device=triton_device)
    _close(triton_norm.rms_norm(x, weight, 1e-6), norm.rms_norm(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_of_a_strided_view(triton_device: torch.device, dtype: str, tokens: int) -> None:
    torch.manual_seed(tokens)
    wide = torch.randn(tokens, 2 * 96, dtype=dtype_from_name(dtype), device=triton_device)
    x, residual = wide[:, :96], torch.randn(tokens, 96, dtype=wide.dtype, device=triton_device)
    weight = torch.randn(96, dtype=wide.dtype, device=triton_device)
    _close(triton_norm.fused_add_rms_norm(x, residual, weight, 1e-5),
           norm.fused_add_rms_norm(x, residual, weight, 1e-5), dtype)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(triton_device: torch.device, dtype: str, tokens: int) -> None:
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 2, 2 * 40, dtype=dtype_from_name(dtype), device=triton_device)  # [..., 2I], 3-d
    _close(triton_activation.silu_and_mul(x), activation.silu_and_mul(x), dtype)


@pytest.mark.parametrize("is_neox_style", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 8])  # full and partial rotary
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding_on_views_of_a_merged_qkv(triton_device: torch.device, dtype: str, tokens: int,
                                                   rotary_dim: int, is_neox_style: bool) -> None:
    torch.manual_seed(tokens)
    head_dim, heads, kv_heads = 16, 4, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype_from_name(dtype), device=triton_device)
    query, key = qkv[:, : heads * head_dim], qkv[:, heads * head_dim : (heads + kv_heads) * head_dim]
    angles = torch.rand(tokens, 1, rotary_dim // 2, device=triton_device) * 6
    args = (angles.cos().to(qkv.dtype), angles.sin().to(qkv.dtype), head_dim, rotary_dim, is_neox_style)
    _close(triton_rotary.rotary_embedding(query, key, *args), rotary.rotary_embedding(query, key, *args), dtype)
    # [T, H, D] inputs keep their shape.
    query3, key3 = query.reshape(tokens, heads, head_dim), key.reshape(tokens, kv_heads, head_dim)
    _close(triton_rotary.rotary_embedding(query3, key3, *args), rotary.rotary_embedding(query3, key3, *args), dtype)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_cache_store(triton_device: torch.device, dtype: str, tokens: int) -> None:
    torch.manual_seed(tokens)
    block_size, blocks, kv_heads, head_dim = 16, 8, 2, 24
    torch_dtype = dtype_from_name(dtype)
    kv = torch.randn(tokens, 2 * kv_heads * head_dim, dtype=torch_dtype, device=triton_device)
    key = kv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)  # strided, as split from qkv
    value = kv[:, kv_heads * head_dim :].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(blocks * block_size, device=triton_device)[:tokens]
    cache = torch.randn(2, blocks, block_size, kv_heads, head_dim, dtype=torch_dtype, device=triton_device)
    expected = cache.clone()
    triton_kv_cache.write_kv_cache(key, value, cache, slots)
    reference_store(key, value, expected, slots)
    assert torch.equal(cache, expected)  # a copy in the cache dtype: exact


def test_kv_cache_store_rejects_a_mismatched_cache(triton_device: torch.device) -> None:
    key = torch.randn(3, 2, 8, device=triton_device)
    cache = torch.zeros(2, 4, 16, 2, 16, device=triton_device)
    with pytest.raises(ValueError, match="do not match cache rows"):
        triton_kv_cache.write_kv_cache(key, key, cache, torch.arange(3, device=triton_device))
