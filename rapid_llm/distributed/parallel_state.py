"""Which tensor-parallel rank this process is, and the collectives sharded layers need.

Set once per worker process before the model is built (the worker owns the
torch.distributed group); read by layers when they shard weights. With one rank every
collective is the identity, so single-device runs never touch torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class _TensorParallel:
    rank: int = 0
    size: int = 1


_tp = _TensorParallel()


def init_tensor_parallel(rank: int, size: int) -> None:
    """Record this process's rank; for size > 1 torch.distributed must already be initialised."""
    global _tp
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank {rank} is outside [0, {size})")
    if size > 1 and not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs torch.distributed initialised before the model is built")
    _tp = _TensorParallel(rank, size)


def get_tp_rank() -> int:
    return _tp.rank


def get_tp_size() -> int:
    return _tp.size


def tp_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    if _tp.size > 1:
        dist.all_reduce(tensor)
    return tensor


def tp_broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Every rank's `tensor` becomes rank `src`'s (in place)."""
    if _tp.size > 1:
        dist.broadcast(tensor, src)
    return tensor


def tp_min(value: int) -> int:
    """The smallest of every rank's `value` (e.g. the KV blocks all ranks can hold)."""
    if _tp.size == 1:
        return value
    # NCCL reduces device tensors only.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    reduced = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MIN)
    return int(reduced.item())


def tp_all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if _tp.size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(_tp.size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=dim)
