"""Int4 arithmetic shared by GPTQ, AWQ, online int4 and the quantize tool: unpack, dequantize, quantize, int8 activations.

One canonical form: values `q` uint8 [out, in] in 0..15, `scales` and `zeros` fp32 [out, groups] (zeros are
integers held as floats), contiguous groups of `group_size` input channels; the real weight is (q - zero) * scale.
Checkpoint layouts are int32 words of eight nibbles, lowest nibble first, along one dim; AWQ interleaves the
nibbles of a word (`AWQ_ORDER`). Round-to-nearest (RTN) quantization follows GPTQ's grid: asymmetric
scale = (max - min) / 15 with the range widened to hold 0, symmetric scale = 2 * amax / 15 with zero 8.
Usage: `q = unpack_int32(qweight, dim=0)`; `w = dequantize(q, scales, zeros, 128, torch.bfloat16)`.
"""

from __future__ import annotations

import torch

MAX_Q = 15
SYMMETRIC_ZERO = 8
NIBBLES = 8  # per int32 word
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output column of the word's group of 8 held by nibble i
_MIN_SCALE = 1e-10  # an all-zero group keeps a positive scale
INT8_MAX = 127.0


def unpack_int32(packed: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 words along `dim` -> uint8 values, eight per word (nibble i of word w is element 8w + order[i],
    `order` None: 8w + i)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    words = packed.movedim(dim, -1).to(torch.int32)
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF  # [..., words, 8]: nibble i
    if order is not None:
        nibbles = nibbles[..., [order.index(j) for j in range(NIBBLES)]]
    return nibbles.flatten(-2).to(torch.uint8).movedim(-1, dim)


def pack_int32(values: torch.Tensor, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """The inverse of `unpack_int32`: values 0..15 along `dim` (a multiple of 8) -> int32 words."""
    grouped = values.movedim(dim, -1).to(torch.int64).unflatten(-1, (-1, NIBBLES))
    if order is not None:
        grouped = grouped[..., list(order)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=values.device)
    words = (grouped << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).movedim(-1, dim)


def expand_groups(per_group: torch.Tensor, group_size: int, columns: int) -> torch.Tensor:
    """[out, groups] -> [out, columns]: each group's value repeated over its input channels."""
    return per_group.repeat_interleave(group_size, dim=1)[:, :columns]


def dequantize(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
               dtype: torch.dtype) -> torch.Tensor:
    """(q - zero) * scale [out, in] in `dtype` (fp32 products, rounded once)."""
    columns = q.shape[1]
    return ((q.float() - expand_groups(zeros, group_size, columns))
            * expand_groups(scales.float(), group_size, columns)).to(dtype)


def group_params(w: torch.Tensor, sym: bool, min_zero: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) per row of `w` [rows, columns]: the grid every column of a row is quantized on (asymmetric
    zeros kept >= `min_zero`: GPTQ v1 checkpoints cannot store 0)."""
    w = w.float()
    if sym:
        amax = w.abs().amax(dim=1)
        scale = (2 * amax / MAX_Q).clamp(min=_MIN_SCALE)
        return scale, torch.full_like(scale, SYMMETRIC_ZERO)
    low, high = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
    scale = ((high - low) / MAX_Q).clamp(min=_MIN_SCALE)
    return scale, torch.round(-low / scale).clamp(min_zero, MAX_Q)


def quantize_values(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """round(w / scale) + zero clamped to 0..15 (scale and zero broadcast against w), as fp32."""
    return (torch.round(w.float() / scale) + zero).clamp(0, MAX_Q)


def quantize_rtn(w: torch.Tensor, group_size: int, sym: bool,
                 min_zero: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest int4 of w [out, in]: (q uint8 [out, in], scales, zeros fp32 [out, groups]);
    `group_size` must divide in (use in for one group per row)."""
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ValueError(f"int4 group size {group_size} does not divide the {in_features} input features")
    grouped = w.float().reshape(out_features * (in_features // group_size), group_size)
    scale, zero = group_params(grouped, sym, min_zero)
    q = quantize_values(grouped, scale[:, None], zero[:, None])
    groups = in_features // group_size
    return (q.reshape(out_features, in_features).to(torch.uint8), scale.reshape(out_features, groups),
            zero.reshape(out_features, groups))


def fake_quantize_int8_per_token(x: torch.Tensor) -> torch.Tensor:
    """x quantized symmetrically to int8 (one scale amax / 127 per token) and back, in x's dtype."""
    scale = (x.float().abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=_MIN_SCALE)
    return (torch.round(x.float() / scale).clamp(-INT8_MAX, INT8_MAX) * scale).to(x.dtype)
