"""Host-built step tensors (of one dtype) onto the device in one asynchronous copy.

On CUDA the tensors are packed into one pinned buffer and copied with `non_blocking=True`: one transfer
instead of one per tensor, and the host does not wait for it. The buffer comes from torch's caching host
allocator, which records the copy's stream and reuses a block only once that copy is done, so the next
step cannot overwrite a buffer still in flight. On the CPU the tensors are returned as they are: pinning
is a CUDA notion (and `pin_memory=True` fails without a CUDA build), and a copy would only cost time.

Usage:
    positions, seq_index = to_device([positions_host, seq_index_host], device)  # both int64
"""

from __future__ import annotations

from typing import Sequence

import torch


def to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The host `tensors` (one dtype) on `device`, each with its shape (views of one device buffer on CUDA)."""
    if device.type == "cpu" or not tensors:
        return list(tensors)
    dtype = tensors[0].dtype
    if any(tensor.dtype != dtype for tensor in tensors):
        raise ValueError(f"to_device stages tensors of one dtype, got {[t.dtype for t in tensors]}")
    sizes = [tensor.numel() for tensor in tensors]
    pinned = torch.empty(sum(sizes), dtype=dtype, pin_memory=True)
    torch.cat([tensor.reshape(-1) for tensor in tensors], out=pinned)
    staged = pinned.to(device, non_blocking=True)
    return [part.view(tensor.shape) for part, tensor in zip(staged.split(sizes), tensors)]
