"""Host-side helper every Triton op wrapper shares: warp counts.

Kernels address rows by a row stride and expect the last dim contiguous (`ops/tensor_rows.rows_of`), so
a strided view (e.g. q split out of a merged qkv projection) is passed without a copy.
"""

from __future__ import annotations


def warps_for(block: int) -> int:
    """Warps for a program working on `block` elements: about 256 elements per warp, 1 to 16 warps."""
    return min(max(block // 256, 1), 16)
