"""FP8 e4m3 scales, quantization and dequantization, written once for weights and activations.

A scale maps an fp8 value back to real units: real = fp8 * scale, with scale = amax / 448 (e4m3's largest
finite value) over the group it covers -- a whole matrix, a row, a [block_n, block_k] tile of a weight, or a
token's group of block_k activations. ue8m0 rounds each scale up to a power of two (so no value overflows).
Tiles at a matrix's edge may be partial: scales cover ceil(out / block_n) x ceil(in / block_k) tiles.
Usage: `q, scale = quantize_weight(w, (128, 128), ue8m0=False)`; `w = dequantize_weight(q, scale, (128, 128), dtype)`.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# An all-zero group gets this amax, so its scale is positive and 0 / scale stays 0.
_MIN_AMAX = 1e-12


def scale_of(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    scale = amax.float().clamp(min=_MIN_AMAX) / FP8_MAX
    return torch.exp2(torch.ceil(torch.log2(scale))) if ue8m0 else scale


def to_fp8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """values / scale (scale broadcast), saturated to e4m3's range and rounded to e4m3."""
    return (values.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _tiled(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """w zero-padded to whole tiles, viewed [tiles_n, block_n, tiles_k, block_k]."""
    (n, k), (bn, bk) = w.shape, block
    padded = torch.nn.functional.pad(w.float(), (0, -k % bk, 0, -n % bn))
    return padded.view(padded.shape[0] // bn, bn, padded.shape[1] // bk, bk)


def expand_block_scales(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """[tiles_n, tiles_k] tile scales -> one per weight element ([out, in])."""
    rows = scale.repeat_interleave(block[0], dim=0)[: shape[0]]
    return rows.repeat_interleave(block[1], dim=1)[:, : shape[1]]


def quantize_weight(w: torch.Tensor, block: tuple[int, int] | None, ue8m0: bool = False,
                    per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight [out, in], fp32 scales): [tiles_n, tiles_k] for a block, [out, 1] per row, else [1, 1]."""
    if block is not None:
        scale = scale_of(_tiled(w, block).abs().amax(dim=(1, 3)), ue8m0)
        return to_fp8(w, expand_block_scales(scale, block, w.shape)), scale
    amax = w.abs().amax(dim=1, keepdim=True) if per_row else w.abs().amax().reshape(1, 1)
    scale = scale_of(amax, ue8m0)
    return to_fp8(w, scale), scale


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None,
                      dtype: torch.dtype) -> torch.Tensor:
    """The real weight [out, in] in `dtype` (products taken in fp32, rounded once)."""
    full = expand_block_scales(scale, block, q.shape) if block is not None else scale
    return (q.float() * full).to(dtype)


def fake_quantize_activation(x: torch.Tensor, group: int | None, static_scale: torch.Tensor | None,
                             ue8m0: bool = False, amax_bound: float | None = None) -> torch.Tensor:
    """x quantized to fp8 and back in x's dtype: with one static scale, or dynamically per token (`group`
    None) or per token and group of `group` features (the last one may be partial)."""
    if static_scale is not None:
        return (to_fp8(x, static_scale).float() * static_scale).to(x.dtype)
    k = x.shape[-1]
    group = group or k
    grouped = torch.nn.functional.pad(x.float(), (0, -k % group)).unflatten(-1, (-1, group))
    amax = grouped.abs().amax(dim=-1, keepdim=True)
    if amax_bound is not None:
        amax = amax.clamp(max=amax_bound)
    scale = scale_of(amax, ue8m0)
    restored = to_fp8(grouped, scale).float() * scale
    return restored.flatten(-2)[..., :k].to(x.dtype)
