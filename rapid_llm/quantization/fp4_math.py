"""FP4 (e2m1) codes, nibble packing, and the NVFP4 / MXFP4 group scales, written once for weights, activations
and the nvfp4 KV cache.

An e2m1 code is 4 bits (sign, 2 exponent, 1 mantissa) indexing FP4_VALUES; two codes share a byte, the even
element in the low nibble (as ModelOpt, compressed-tensors and gpt-oss pack them). Encoding rounds to nearest,
ties to even, and saturates at +-6. NVFP4: one fp8 e4m3 scale per 16 elements times a per-tensor fp32 scale
(real = fp4 * fp8_scale * global; global = amax / (448 * 6) so the group scales use e4m3's range).
MXFP4 (OCP microscaling): one e8m0 scale (a byte e, 2 ** (e - 127)) per 32 elements, rounded up to the power
of two that fits the block's amax into +-6 (no value saturates).
Usage: `packed, scales, g = nvfp4_quantize(w)`; `w = nvfp4_dequantize(packed, scales, g, torch.bfloat16)`.
"""

from __future__ import annotations

import torch

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
FP4_MAX = 6.0
FP8_MAX = 448.0
NVFP4_GROUP = 16
MXFP4_BLOCK = 32
E8M0_BIAS = 127
# Midpoints between consecutive magnitudes; at the ones in _TIES_UP a tie rounds up (to the even code).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIES_UP = (False, True, False, True, False, True, False)


def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 2] fp32: the two values (low nibble, high nibble) every byte decodes to."""
    values = torch.tensor(FP4_VALUES, dtype=torch.float32, device=device)
    codes = torch.arange(256, device=device)
    return torch.stack((values[codes & 0xF], values[codes >> 4]), dim=1)


_TABLES: dict[torch.device, torch.Tensor] = {}


def byte_table(device: torch.device) -> torch.Tensor:
    if device not in _TABLES:
        _TABLES[device] = _byte_table(device)
    return _TABLES[device]


def fp4_encode(x: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 codes (uint8 0..15) of x, ties to even, saturated to +-6."""
    magnitude = x.float().abs()
    index = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint, tie_up in zip(_MIDPOINTS, _TIES_UP):
        index += (magnitude >= midpoint) if tie_up else (magnitude > midpoint)
    return index | (torch.signbit(x).to(torch.uint8) << 3)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., n] codes -> [..., n / 2] bytes, element 2i in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"FP4 packing needs an even number of elements in the last dimension, got {codes.shape[-1]}")
    pairs = codes.unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., n / 2] bytes -> [..., n] fp32 values."""
    return byte_table(packed.device)[packed.long()].flatten(-2)


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    if x.shape[-1] % group:
        raise ValueError(f"the last dimension ({x.shape[-1]}) is not a multiple of the FP4 group size {group}")
    return x.float().unflatten(-1, (-1, group))


def _expand(scales: torch.Tensor, group: int) -> torch.Tensor:
    return scales.float().unsqueeze(-1).expand(*scales.shape, group)


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """The per-tensor dequantization scale amax / (448 * 6) (ModelOpt's weight_scale_2; compressed-tensors
    stores its reciprocal as the global scale)."""
    return (amax.float().clamp(min=1e-12) / (FP8_MAX * FP4_MAX)).reshape(())


def nvfp4_quantize_groups(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [..., n / 16, 16] uint8, fp8 group scales [..., n / 16]) with real = fp4 * scale * global_scale."""
    groups = _grouped(x, NVFP4_GROUP)
    global_scale = global_scale.float()
    scales = (groups.abs().amax(dim=-1) / FP4_MAX / global_scale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    step = _expand(scales, NVFP4_GROUP) * global_scale.unsqueeze(-1)
    # A group whose scale underflows to 0 stores zeros (its values are below e4m3's reach).
    codes = fp4_encode(torch.where(step > 0, groups / step.clamp(min=1e-30), 0.0))
    return codes, scales


def nvfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed uint8 [..., n / 2], fp8 scales [..., n / 16], fp32 global scale []) of a tensor."""
    global_scale = nvfp4_global_scale(w.abs().amax())
    codes, scales = nvfp4_quantize_groups(w, global_scale)
    return pack_fp4(codes.flatten(-2)), scales, global_scale


def nvfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor:
    """fp4 * fp8 group scale * global scale (broadcast against [..., 1], e.g. one per row), in `dtype`."""
    values = unpack_fp4(packed).unflatten(-1, (-1, NVFP4_GROUP)) * _expand(scales, NVFP4_GROUP)
    return (values.flatten(-2) * global_scale.float()).to(dtype)


def nvfp4_fake_quantize(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """x quantized to NVFP4 and back in x's dtype (W4A4 activations): fp8 scales per token and 16 features
    computed on the fly, under the calibrated per-tensor `global_scale`."""
    codes, scales = nvfp4_quantize_groups(x, global_scale)
    values = unpack_fp4(pack_fp4(codes.flatten(-2))).unflatten(-1, (-1, NVFP4_GROUP))
    return ((values * _expand(scales, NVFP4_GROUP)).flatten(-2) * global_scale.float()).to(x.dtype)


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [..., n / 2], e8m0 scale bytes [..., n / 32])."""
    blocks = _grouped(w, MXFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1).clamp(min=2.0 ** -126)
    exponent = torch.ceil(torch.log2(amax / FP4_MAX)).clamp(-E8M0_BIAS, E8M0_BIAS)
    codes = fp4_encode(blocks / torch.exp2(exponent).unsqueeze(-1))
    return pack_fp4(codes.flatten(-2)), (exponent + E8M0_BIAS).to(torch.uint8)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    return torch.exp2(scales.float() - E8M0_BIAS)


def mxfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp4 * 2 ** (scale - 127) per block of 32, in `dtype`."""
    values = unpack_fp4(packed).unflatten(-1, (-1, MXFP4_BLOCK)) * _expand(e8m0_to_float(scales), MXFP4_BLOCK)
    return values.flatten(-2).to(dtype)
