"""RMSNorm and fused residual-add + RMSNorm in Triton: one program per row, the row in registers.

Rounding follows the torch reference (and HF): the residual sum and the normalised row are rounded
to the input dtype before use, so half-precision results match it instead of drifting by a step.
Usage: `rms_norm(x, weight, eps)`, `fused_add_rms_norm(x, residual, weight, eps)` (CUDA tensors).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.tensor_rows import rows_of
from rapid_llm.ops.triton.launch import warps_for


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, summed_ptr, x_row_stride, residual_row_stride,
                     hidden, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * residual_row_stride + cols, mask=mask, other=0.0)
        summed = (x + residual.to(tl.float32)).to(summed_ptr.dtype.element_ty)
        tl.store(summed_ptr + row * hidden + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden
    normed = (x * tl.rsqrt(variance + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} does not match hidden size {hidden}")
    rows = rows_of(x)
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    summed = None
    residual_rows = rows
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"fused_add_rms_norm: residual {tuple(residual.shape)} != x {tuple(x.shape)}")
        residual_rows = rows_of(residual)
        summed = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(rows.shape[0],)](
        rows, residual_rows, weight.contiguous(), out, summed, rows.stride(0), residual_rows.stride(0), hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps_for(block))
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalise(x) over the last dim."""
    return _launch(x, None, weight, eps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is the next layer's residual."""
    out, summed = _launch(x, residual, weight, eps)
    return out, summed
