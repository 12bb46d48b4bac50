"""silu(gate) * up in Triton over the merged [gate | up] projection output.

Like the torch reference, silu is rounded to the output dtype before the multiply (F.silu returns a
tensor of the input dtype), so half-precision results match it.
Usage: `silu_and_mul(x)` with x [..., 2 * intermediate] on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.tensor_rows import rows_of
from rapid_llm.ops.triton.launch import warps_for

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_row_stride, intermediate, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < intermediate
    gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_row_stride + intermediate + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * intermediate + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, where x is [..., 2 * intermediate] = [gate | up]."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: the last dim ({x.shape[-1]}) must be even, [gate | up]")
    intermediate = x.shape[-1] // 2
    rows = rows_of(x)
    out = torch.empty(*x.shape[:-1], intermediate, dtype=x.dtype, device=x.device)
    block = min(_BLOCK, triton.next_power_of_2(intermediate))
    grid = (rows.shape[0], triton.cdiv(intermediate, block))
    _silu_and_mul_kernel[grid](rows, out, rows.stride(0), intermediate, BLOCK=block, num_warps=warps_for(block))
    return out
