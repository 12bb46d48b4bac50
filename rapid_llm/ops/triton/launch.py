"""Host-side helpers every Triton op wrapper shares: row views of inputs and warp counts.

Kernels address rows by a row stride and expect the last dim contiguous, so a strided view (e.g. q
split out of a merged qkv projection) is passed without a copy.
"""

from __future__ import annotations

import torch


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a unit last stride, a view whenever possible."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def warps_for(block: int) -> int:
    """Warps for a program working on `block` elements: about 256 elements per warp, 1 to 16 warps."""
    return min(max(block // 256, 1), 16)
