"""Quantized KV caches, FP8 (e4m3) and NVFP4: quantize K/V rows on write, dequantize the gathered history inside
attention.

One scale per layer for K and one for V (per tensor), read from the checkpoint's `k_scale`/`v_scale`
when it has them and 1.0 otherwise, as vLLM does. The scale is a dequantization scale: the cache
holds x / scale saturated to +-448 (e4m3's largest finite value; a plain cast would turn larger
values into NaN) and attention reads cache * scale. With scale 1.0 that keeps |K|, |V| <= 448 exact in
range and rounds to 3 mantissa bits (relative error <= 2**-4). CPU torch has no index_copy_/index_fill_
for float8, so writes go through uint8 views of the same bytes (0x00 is +0.0, so zeroing is unchanged).
NVFP4 (a uint8 cache): each head's row of head_dim values is head_dim / 2 bytes of e2m1 codes (two per byte)
then head_dim / 16 fp8 e4m3 scales, one per 16 values (amax / 6, computed on write); no per-tensor scale
(1.0), so groups whose amax is below ~0.09 get subnormal scales. All zero bytes decode to 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rapid_llm.config.cache_config import KV_CACHE_STORAGE, NVFP4_KV_CACHE_DTYPE
from rapid_llm.quantization.fp4_math import NVFP4_GROUP, nvfp4_dequantize, nvfp4_quantize_groups, pack_fp4

FP8_KV_DTYPE = getattr(torch, KV_CACHE_STORAGE["fp8"])
FP8_MAX = torch.finfo(FP8_KV_DTYPE).max  # 448.0
NVFP4_KV_DTYPE = getattr(torch, KV_CACHE_STORAGE[NVFP4_KV_CACHE_DTYPE])  # no float KV dtype is uint8
_UNIT = torch.ones(())


@dataclass(frozen=True)
class KVScales:
    """Per-tensor dequantization scales of one layer's K and V cache."""

    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        for name, value in (("k_scale", self.k_scale), ("v_scale", self.v_scale)):
            if not (value > 0.0 and value < float("inf")):
                raise ValueError(f"KV-cache {name} must be a positive finite number, got {value}")


UNIT_KV_SCALES = KVScales()  # an unscaled cache's (frozen: shared rather than built per call)


def is_fp8_kv(dtype: torch.dtype) -> bool:
    return dtype == FP8_KV_DTYPE


def is_nvfp4_kv(dtype: torch.dtype) -> bool:
    return dtype == NVFP4_KV_DTYPE


def kv_format(dtype: torch.dtype) -> str | None:
    """"fp8" or "nvfp4" for a quantized cache dtype, else None."""
    return "fp8" if is_fp8_kv(dtype) else "nvfp4" if is_nvfp4_kv(dtype) else None


def backend_reads_kv(backend: object, dtype: torch.dtype) -> bool:
    """Whether an attention backend reads a cache of `dtype` (quantized ones need `supports_<format>_kv`)."""
    fmt = kv_format(dtype)
    return fmt is None or getattr(backend, f"supports_{fmt}_kv", False)


def nvfp4_row_bytes(head_dim: int) -> int:
    """Bytes one head's K (or V) takes in an nvfp4 cache: packed codes, then one fp8 scale per 16 values."""
    if head_dim % NVFP4_GROUP:
        raise ValueError(f"--kv-cache-dtype nvfp4 needs a head_dim that is a multiple of {NVFP4_GROUP}, got {head_dim}")
    return head_dim // 2 + head_dim // NVFP4_GROUP


def quantize_kv_nvfp4(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] values -> [..., nvfp4_row_bytes(head_dim)] uint8 rows."""
    codes, scales = nvfp4_quantize_groups(x, _UNIT.to(x.device))
    return torch.cat((pack_fp4(codes.flatten(-2)), scales.view(torch.uint8)), dim=-1)


def dequantize_kv_nvfp4(rows: torch.Tensor, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[..., nvfp4_row_bytes(head_dim)] uint8 rows -> [..., head_dim] values in `dtype`."""
    packed, scales = rows[..., : head_dim // 2], rows[..., head_dim // 2:]
    return nvfp4_dequantize(packed, scales.view(torch.float8_e4m3fn), _UNIT.to(rows.device), dtype)


def write_kv_cache_nvfp4(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor) -> None:
    """Quantize new K/V rows and scatter them into an nvfp4 cache [2, blocks, block_size, Hkv, row bytes]."""
    num_kv_heads, width = kv_cache.shape[3], kv_cache.shape[4]
    for index, rows in enumerate((key, value)):
        kv_cache[index].view(-1, num_kv_heads, width).index_copy_(0, slot_mapping, quantize_kv_nvfp4(rows))


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
