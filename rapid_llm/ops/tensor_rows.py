"""`rows_of`: a tensor as [rows, last dim] with a unit last stride, the layout the row kernels take."""

from __future__ import annotations

import torch


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a unit last stride, a view whenever possible."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()
