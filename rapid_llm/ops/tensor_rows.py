"""`rows_of`: a tensor as [rows, last dim] with a unit last stride, the layout the row kernels take; `unit_last`:
any tensor with a unit last stride, for kernels that take every other dim's stride."""

from __future__ import annotations

import torch


def unit_last(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim is contiguous, else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a unit last stride, a view whenever possible."""
    return unit_last(x.reshape(-1, x.shape[-1]))
