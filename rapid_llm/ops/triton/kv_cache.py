"""The `kv_cache_store` op in Triton: scatter this step's K/V rows into their paged-cache slots.

One program per token copies all of its KV heads for both K and V (one slot row is Hkv * D
contiguous elements in the [2, blocks, block_size, Hkv, D] layout), casting to the cache dtype.
Usage: `write_kv_cache(key, value, kv_cache, slot_mapping)` on CUDA, as the torch_ref op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.triton.launch import warps_for


@triton.jit
def _store_kernel(key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr, key_token_stride,
                  key_head_stride, value_token_stride, value_head_stride, head_dim, row_size, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < row_size
    head, dim = offsets // head_dim, offsets % head_dim
    key = tl.load(key_ptr + token * key_token_stride + head * key_head_stride + dim, mask=mask)
    value = tl.load(value_ptr + token * value_token_stride + head * value_head_stride + dim, mask=mask)
    tl.store(k_cache_ptr + slot * row_size + offsets, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + slot * row_size + offsets, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key/value [T, Hkv, D] into kv_cache [2, blocks, block_size, Hkv, D] at slot_mapping [T]."""
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache_store: the KV cache must be contiguous")
    if key.shape != value.shape or key.shape[1:] != kv_cache.shape[3:]:
        raise ValueError(f"kv_cache_store: key {tuple(key.shape)} / value {tuple(value.shape)} do not match "
                         f"cache rows {tuple(kv_cache.shape[3:])}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        key, value = key.contiguous(), value.contiguous()
    num_tokens, head_dim = key.shape[0], key.shape[2]
    if num_tokens == 0:
        return
    row_size = key.shape[1] * head_dim
    block = triton.next_power_of_2(row_size)
    _store_kernel[(num_tokens,)](
        key, value, kv_cache[0], kv_cache[1], slot_mapping, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), head_dim, row_size, BLOCK=block, num_warps=warps_for(block))
