"""FP8 (e4m3) KV cache: quantize K/V rows on write, dequantize the gathered history inside attention.

One scale per layer for K and one for V (per tensor), read from the checkpoint's `k_scale`/`v_scale`
when it has them and 1.0 otherwise, as vLLM does. The scale is a dequantization scale: the cache
holds x / scale saturated to +-448 (e4m3's largest finite value; a plain cast would turn larger
values into NaN) and attention reads cache * scale. With scale 1.0 that keeps |K|, |V| <= 448 exact in
range and rounds to 3 mantissa bits (relative error <= 2**-4). CPU torch has no index_copy_/index_fill_
for float8, so writes go through uint8 views of the same bytes (0x00 is +0.0, so zeroing is unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_KV_DTYPE).max  # 448.0


@dataclass(frozen=True)
class KVScales:
    """Per-tensor dequantization scales of one layer's K and V cache."""

    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        for name, value in (("k_scale", self.k_scale), ("v_scale", self.v_scale)):
            if not (value > 0.0 and value < float("inf")):
                raise ValueError(f"KV-cache {name} must be a positive finite number, got {value}")


def is_fp8_kv(dtype: torch.dtype) -> bool:
    return dtype == FP8_KV_DTYPE


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale as float8 e4m3, saturated to +-448 (computed in fp32)."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """float8 values times their scale, in `dtype` (fp8 widens exactly; the product rounds once)."""
    return (x.float() * scale).to(dtype)


def write_kv_cache_fp8(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                       scales: KVScales) -> None:
    """Quantize new K/V rows and scatter them into an fp8 cache [2, blocks, block_size, Hkv, D]."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    raw = kv_cache.view(torch.uint8)
    for index, (rows, scale) in enumerate(((key, scales.k_scale), (value, scales.v_scale))):
        raw[index].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, quantize_kv(rows, scale).view(torch.uint8))
