"""Activation fake quantization in Triton: x quantized and restored in x's dtype, for the W8A8 / W4A8 / W4A4 GEMMs.

The same numerics as the torch references, bit for bit in fp32: FP8 e4m3 per token, per token and group, or
under a static scale, with optional ue8m0 scales and an amax bound (`quantization/fp8_math.py`); int8 per token
(`int4_math.fake_quantize_int8_per_token`); NVFP4 per 16 features under a global scale (`fp4_math`). Divisions
are IEEE (`div_rn`: Triton's default fp32 division is approximate on GPUs); ue8m0, the e4m3 rounding and
round-half-even are exact bit and integer arithmetic, so no cast or libdevice call decides a rounding. The GEMMs
read the restored x: one pass here, then plain tiles there, with the reference's rounding points.
Usage: `fake_quantize_fp8(x, group, static_scale, ue8m0, bound)`, `fake_quantize_int8(x)`, `fake_quantize_nvfp4(x, g)`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.tensor_rows import rows_of
from rapid_llm.ops.triton.launch import warps_for

MODE_FP8 = tl.constexpr(0)  # dynamic scales, per token or token group
MODE_FP8_STATIC = tl.constexpr(1)
MODE_INT8 = tl.constexpr(2)
_CHUNK = 1024
_NVFP4_GROUP = 16


@triton.jit
def round_half_even(v):
    """Nearest integer, ties to even (torch.round), exact for any fp32 value."""
    down = tl.floor(v)
    frac = v - down
    odd = (down - 2.0 * tl.floor(down * 0.5)) == 1.0
    return tl.where((frac > 0.5) | ((frac == 0.5) & odd), down + 1.0, down)


@triton.jit
def e2m1_magnitude(index):
    """The e2m1 magnitude of a 3-bit index 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    index = index.to(tl.float32)
    return tl.where(index < 4.0, index * 0.5, tl.where(index < 6.0, index - 2.0, tl.where(index < 7.0, 4.0, 6.0)))


@triton.jit
def round_to_e4m3(v):
    """v (|v| <= 448) rounded to the nearest fp8 e4m3 value, ties to even, as fp32: the step is 2 ** (e - 3) for
    v's exponent e (at least e4m3's -6: subnormals), so both scalings by powers of two are exact. Arithmetic instead
    of a cast: Triton's interpreter casts wrongly where the rounding carries into the exponent."""
    exponent = tl.maximum(((tl.abs(v).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((127 - exponent + 3) << 23).to(tl.float32, bitcast=True)
    return round_half_even(v * inverse) * step


@triton.jit
def _ceil_power_of_two(scale):
    """The smallest power of two >= scale (a positive normal fp32): the ue8m0 rounding, on the bits."""
    bits = scale.to(tl.int32, bitcast=True)
    return ((bits + 0x7FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)


@triton.jit
def _fake_quantize_kernel(x_ptr, out_ptr, static_scale_ptr, x_row_stride, k, group, amax_bound, MODE: tl.constexpr,
                          UE8M0: tl.constexpr, HAS_BOUND: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * group
    offsets = tl.arange(0, BLOCK)
    if MODE == MODE_FP8_STATIC:
        scale = tl.load(static_scale_ptr).to(tl.float32)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, group, BLOCK):
            cols = first + start + offsets
            mask = (start + offsets < group) & (cols < k)
            x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        amax = tl.max(amax, axis=0)
        if MODE == MODE_INT8:
            scale = tl.maximum(tl.div_rn(amax, 127.0), 1e-10)
        else:
            if HAS_BOUND:
                amax = tl.minimum(amax, amax_bound)
            scale = tl.div_rn(tl.maximum(amax, 1e-12), 448.0)
            if UE8M0:
                scale = _ceil_power_of_two(scale)
    for start in range(0, group, BLOCK):
        cols = first + start + offsets
        mask = (start + offsets < group) & (cols < k)
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        scaled = tl.div_rn(x, scale)
        if MODE == MODE_INT8:
            restored = tl.minimum(tl.maximum(round_half_even(scaled), -127.0), 127.0) * scale
        else:
            restored = round_to_e4m3(tl.minimum(tl.maximum(scaled, -448.0), 448.0)) * scale
        tl.store(out_ptr + row * k + cols, restored.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _nvfp4_kernel(x_ptr, out_ptr, global_ptr, x_row_stride, k, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < k
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    global_scale = tl.load(global_ptr).to(tl.float32)
    groups = tl.reshape(x, (BLOCK // GROUP, GROUP))
    amax = tl.max(tl.abs(groups), axis=1)
    scales = round_to_e4m3(tl.minimum(tl.div_rn(tl.div_rn(amax, 6.0), global_scale), 448.0))
    step = (scales * global_scale)[:, None]
    scaled = tl.where(step > 0.0, tl.div_rn(groups, tl.maximum(step, 1e-30)), 0.0)
    magnitude = tl.abs(scaled)
    # Nearest e2m1 index with ties to the even code, as fp4_math.fp4_encode counts the midpoints passed.
    index = ((magnitude > 0.25).to(tl.int32) + (magnitude >= 0.75).to(tl.int32) + (magnitude > 1.25).to(tl.int32)
             + (magnitude >= 1.75).to(tl.int32) + (magnitude > 2.5).to(tl.int32) + (magnitude >= 3.5).to(tl.int32)
             + (magnitude > 5.0).to(tl.int32))
    value = e2m1_magnitude(index)
    value = tl.where(scaled < 0.0, -value, value)
    restored = tl.reshape((value * scales[:, None]) * global_scale, (BLOCK,))
    tl.store(out_ptr + row * k + cols, restored.to(out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = rows_of(x)
    return rows, torch.empty(rows.shape, dtype=x.dtype, device=x.device)


def _launch(x: torch.Tensor, mode: tl.constexpr, group: int, static_scale: torch.Tensor | None = None,
            ue8m0: bool = False, amax_bound: float | None = None) -> torch.Tensor:
    rows, out = _rows(x)
    k = rows.shape[1]
    if rows.shape[0] and k:
        block = min(_CHUNK, triton.next_power_of_2(group))
        _fake_quantize_kernel[(rows.shape[0], triton.cdiv(k, group))](
            rows, out, static_scale, rows.stride(0), k, group, 0.0 if amax_bound is None else amax_bound,
            MODE=mode, UE8M0=ue8m0, HAS_BOUND=amax_bound is not None, BLOCK=block, num_warps=warps_for(block))
    return out.view(x.shape)


def fake_quantize_fp8(x: torch.Tensor, group: int | None, static_scale: torch.Tensor | None, ue8m0: bool = False,
                      amax_bound: float | None = None) -> torch.Tensor:
    """fp8_math.fake_quantize_activation: a static scale, or dynamic per token (`group` None) or token group."""
    if static_scale is not None:
        return _launch(x, MODE_FP8_STATIC, x.shape[-1], static_scale.reshape(1).float())
    if group is not None and group < 1:
        raise ValueError(f"fp8 activation group must be positive, got {group}")
    return _launch(x, MODE_FP8, group or x.shape[-1], ue8m0=ue8m0, amax_bound=amax_bound)


def fake_quantize_int8(x: torch.Tensor) -> torch.Tensor:
    """int4_math.fake_quantize_int8_per_token: symmetric int8, one scale amax / 127 per token."""
    return _launch(x, MODE_INT8, x.shape[-1])


def fake_quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """fp4_math.nvfp4_fake_quantize: NVFP4 per token and 16 features, fp8 group scales under `global_scale`."""
    if x.shape[-1] % _NVFP4_GROUP:
        raise ValueError(f"NVFP4 activations need a multiple of {_NVFP4_GROUP} features, got {x.shape[-1]}")
    rows, out = _rows(x)
    k = rows.shape[1]
    if rows.shape[0] and k:
        block = min(_CHUNK, triton.next_power_of_2(k))
        _nvfp4_kernel[(rows.shape[0], triton.cdiv(k, block))](
            rows, out, global_scale.reshape(1).float(), rows.stride(0), k, BLOCK=block, GROUP=_NVFP4_GROUP,
            num_warps=warps_for(block))
    return out.view(x.shape)
