"""Which tensor-parallel rank this process is, and the collectives sharded layers need.

Without pipeline stages the tensor-parallel group is the whole torch.distributed world; with them it is this
stage's block of ranks (distributed/pipeline.py), a group `process_group.init_worker_group` creates and records
here before the model is built. With decode context parallelism, blocks of N consecutive tensor-parallel ranks
(which hold the same KV heads) form a DCP group each: they split every sequence's tokens, not its heads. With
prefill context parallelism the world is P tensor-parallel groups of whole-model replicas; the ranks with the same
tensor-parallel rank form a PCP group each, which splits every step's tokens (distributed/prefill_context.py).
Layers read the size when they shard weights. Without a group (one rank) every
collective is the identity and torch.distributed is never touched. Every collective is timed
(`collective_timer.py`); all-reduce and all-gather, inside a two-batch-overlap micro-batch, are issued asynchronously
(`micro_batch_overlap.py`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rapid_llm.distributed.collective_timer import timed
from rapid_llm.distributed.micro_batch_overlap import run_collective


_tp_group: dist.ProcessGroup | None = None  # None: the whole world


def set_tp_group(group: dist.ProcessGroup | None) -> None:
    global _tp_group
    _tp_group = group


def get_tp_group() -> dist.ProcessGroup | None:
    return _tp_group


_dcp_group: dist.ProcessGroup | None = None  # decode context parallelism: ranks sharing KV heads, not tokens


def set_dcp_group(group: dist.ProcessGroup | None) -> None:
    global _dcp_group
    _dcp_group = group


def get_dcp_group() -> dist.ProcessGroup | None:
    return _dcp_group


def get_dcp_rank() -> int:
    return dist.get_rank(_dcp_group) if _dcp_group is not None else 0


def get_dcp_size() -> int:
    return dist.get_world_size(_dcp_group) if _dcp_group is not None else 1


_pcp_group: dist.ProcessGroup | None = None  # prefill context parallelism: replicas that split a step's tokens


def set_pcp_group(group: dist.ProcessGroup | None) -> None:
    global _pcp_group
    _pcp_group = group


def get_pcp_group() -> dist.ProcessGroup | None:
    return _pcp_group


def get_pcp_rank() -> int:
    return dist.get_rank(_pcp_group) if _pcp_group is not None else 0


def get_pcp_size() -> int:
    return dist.get_world_size(_pcp_group) if _pcp_group is not None else 1


def get_tp_rank() -> int:
    return dist.get_rank(_tp_group) if dist.is_initialized() else 0


def get_tp_size() -> int:
    return dist.get_world_size(_tp_group) if dist.is_initialized() else 1


def tp_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over the ranks, in place."""
    if get_tp_size() > 1:
        run_collective(tensor.device, "all_reduce",
                       lambda async_op: dist.all_reduce(tensor, group=_tp_group, async_op=async_op))
    return tensor


def tp_broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Every rank's `tensor` becomes tensor-parallel rank `src`'s (in place)."""
    if get_tp_size() > 1:
        with timed(tensor.device):
            dist.broadcast(tensor, group=_tp_group, group_src=src)
    return tensor


def world_min(value: int) -> int:
    """The smallest of every rank's `value`, over every stage and tensor-parallel rank (e.g. the KV blocks all
    ranks can hold)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    # NCCL reduces device tensors only.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    reduced = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MIN)
    return int(reduced.item())


def tp_all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The ranks' tensors concatenated along `dim`, in rank order, on every rank."""
    size = get_tp_size()
    if size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(size)]
    contiguous = tensor.contiguous()
    run_collective(tensor.device, "all_gather",
                   lambda async_op: dist.all_gather(parts, contiguous, group=_tp_group, async_op=async_op))
    return torch.cat(parts, dim=dim)
