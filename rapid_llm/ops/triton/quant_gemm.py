"""One dequantize-GEMM in Triton for every quantized weight format: y = x @ dequant(W)ᵀ + b, the weight decoded
tile by tile in the kernel, never materialized.

Each program computes a [BLOCK_M, BLOCK_N] output tile: per BLOCK_K step it loads x (already fake-quantized by
`quant_activation.py` where the format quantizes activations), decodes the weight tile from its stored bytes and
scales (FORMAT: fp8 e4m3 with tile/row/tensor scales, int4 nibbles with group scale and zero, NVFP4 e2m1 with
e4m3 group scales times a per-row global, MXFP4 e2m1 with e8m0 scales), rounds it to the activation dtype as
the torch references do, and accumulates in fp32. So the results equal torch_ref's up to summation order.
The dot runs in the activation dtype: the win is the weight's bytes read (1/2 or 1/4 of bf16), not fp8 / int
tensor-core math. fp8 bytes are decoded with integer ops, so it also runs where Triton has no e4m3 type (sm_80).
Usage: `dequant_gemm(x, FP8, weight, out_features, scales, ...)` from the quant_*_gemm.py wrappers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.tensor_rows import rows_of
from rapid_llm.ops.triton.attention_common import dot_operands
from rapid_llm.ops.triton.quant_activation import e2m1_magnitude

FP8 = tl.constexpr(0)
INT4 = tl.constexpr(1)
NVFP4 = tl.constexpr(2)
MXFP4 = tl.constexpr(3)
_BLOCK_N = 64
_BLOCK_K = 32


@triton.jit
def _nibble(w_ptr, cols, depth, mask, w_row_stride):
    """[BLOCK_K, BLOCK_N] 4-bit codes of bytes [N, K / 2], the even element in the low nibble."""
    byte = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_row_stride + depth[:, None] // 2, mask=mask, other=0)
    return (byte.to(tl.int32) >> ((depth[:, None] % 2) * 4)) & 0xF


@triton.jit
def e4m3_to_float(byte):
    """fp8 e4m3 bytes (held as uint8) -> fp32, from the bits: sm_80 and older have no e4m3 type to load."""
    bits = byte.to(tl.int32)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    normal = ((exponent + 120) << 23) | (mantissa << 20)  # 2 ** (e - 7) * (1 + m / 8)
    normal = tl.where((exponent == 0xF) & (mantissa == 0x7), 0x7FC00000, normal)  # the one NaN code
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal.to(tl.float32, bitcast=True))
    return tl.where((bits & 0x80) != 0, -magnitude, magnitude)


@triton.jit
def _e2m1(code):
    magnitude = e2m1_magnitude(code & 7)
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def _weight_tile(w_ptr, scale_ptr, aux_ptr, cols, depth, mask, w_row_stride, scale_row_stride, aux_stride,
                 group_n, group_k, FORMAT: tl.constexpr):
    """The real weight [BLOCK_K, BLOCK_N] in fp32: element (k, n) of W [N, K] at depth[k], cols[n].

    Scales sit at (n // group_n) * scale_row_stride + k // group_k (FP8 rows: group_n 1, group_k K; one scale
    for the tensor: scale_row_stride 0). `aux_ptr`: int4 zeros (interleaved with the scales), the NVFP4 global.
    """
    scale_offsets = (cols[None, :] // group_n).to(tl.int64) * scale_row_stride + depth[:, None] // group_k
    if FORMAT == FP8:
        q = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_row_stride + depth[:, None], mask=mask, other=0)
        return e4m3_to_float(q) * tl.load(scale_ptr + scale_offsets, mask=mask, other=0.0)
    code = _nibble(w_ptr, cols, depth, mask, w_row_stride)
    if FORMAT == INT4:  # params [N, groups, 2]: (scale, zero) pairs
        scale = tl.load(scale_ptr + 2 * scale_offsets, mask=mask, other=0.0)
        zero = tl.load(scale_ptr + 2 * scale_offsets + 1, mask=mask, other=0.0)
        return (code.to(tl.float32) - zero) * scale
    if FORMAT == NVFP4:
        scale = e4m3_to_float(tl.load(scale_ptr + scale_offsets, mask=mask, other=0))
        global_scale = tl.load(aux_ptr + cols[None, :] * aux_stride, mask=mask, other=0.0)
        return (_e2m1(code) * scale) * global_scale
    exponent = tl.load(scale_ptr + scale_offsets, mask=mask, other=0).to(tl.int32)  # MXFP4: e8m0 bytes
    # 2 ** (e - 127) from its bits (e = 0 is the subnormal 2 ** -127).
    scale = tl.where(exponent == 0, 0x400000, exponent << 23).to(tl.float32, bitcast=True)
    return _e2m1(code) * scale


@triton.jit
def _dequant_gemm_kernel(x_ptr, w_ptr, scale_ptr, aux_ptr, bias_ptr, out_ptr, m, n, k, x_row_stride, w_row_stride,
                         scale_row_stride, aux_stride, group_n, group_k, FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < m, cols < n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        depth = start + tl.arange(0, BLOCK_K)
        depth_mask = depth < k
        a = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_row_stride + depth[None, :],
                    mask=row_mask[:, None] & depth_mask[None, :], other=0.0)
        w = _weight_tile(w_ptr, scale_ptr, aux_ptr, cols, depth, depth_mask[:, None] & col_mask[None, :],
                         w_row_stride, scale_row_stride, aux_stride, group_n, group_k, FORMAT)
        # The reference's dequantized weight is rounded to the activation dtype before its matmul.
        w = w.to(out_ptr.dtype.element_ty)
        acc = tl.dot(a.to(DOT_DTYPE), w.to(DOT_DTYPE), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    out_offsets = rows[:, None].to(tl.int64) * n + cols[None, :]
    tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


def _block_m(rows: int) -> int:
    """16 rows for decode (tl.dot's smallest tile), up to 64 for prefill."""
    return min(64, max(16, triton.next_power_of_2(rows)))


def dequant_gemm(x: torch.Tensor, fmt: tl.constexpr, weight: torch.Tensor, out_features: int, scale: torch.Tensor,
                 scale_row_stride: int, group_n: int, group_k: int, bias: torch.Tensor | None,
                 aux: torch.Tensor | None = None, aux_stride: int = 0) -> torch.Tensor:
    """x [..., K] @ the `fmt` weight [out_features, K] (rows of `weight` hold one output each) + bias, in x's dtype."""
    # fp8 tensors travel as their bytes (decoded in the kernel).
    rows, weight = rows_of(x), rows_of(weight).view(torch.uint8)
    scale = scale.view(torch.uint8) if scale.dtype == torch.float8_e4m3fn else scale
    m, k = rows.shape
    if bias is not None and bias.shape != (out_features,):
        raise ValueError(f"quantized linear: bias {tuple(bias.shape)} must be [{out_features}]")
    out = torch.empty(m, out_features, dtype=x.dtype, device=x.device)
    if m and out_features:
        dot_dtype, precision = dot_operands(x)
        block_m = _block_m(m)
        grid = (triton.cdiv(m, block_m), triton.cdiv(out_features, _BLOCK_N))
        _dequant_gemm_kernel[grid](
            rows, weight, scale, aux, None if bias is None else bias.contiguous(), out, m, out_features, k,
            rows.stride(0), weight.stride(0), scale_row_stride, aux_stride, group_n, group_k, FORMAT=fmt,
            HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=_BLOCK_N, BLOCK_K=_BLOCK_K, DOT_DTYPE=dot_dtype,
            PRECISION=precision, num_warps=4, num_stages=3)
    return out.view(*x.shape[:-1], out_features)
