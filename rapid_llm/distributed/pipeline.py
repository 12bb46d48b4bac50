"""Pipeline parallelism: which decoder layers this rank's stage holds, and what passes between stages.

Ranks are numbered stage-major: global rank = stage x tp_size + tp_rank, so each stage's tensor-parallel group
is a block of consecutive ranks, and tp rank r of stage s hands its hidden states and residual to tp rank r of
stage s + 1 (point-to-point send/recv: gloo on the CPU, NCCL on CUDA). Only the last stage computes logits; its
first rank's sampled tokens are broadcast to every rank (`broadcast_sampled`), so each stage's input batch records
the same tokens.
The layer split is even, the remainder going to the last stages (the first one also embeds), unless
`--pp-layer-partition` gives each stage's count. A model reads its stage while it is built (`pipeline_stage()`),
as layers read their tensor-parallel size; without pipeline parallelism the stage is the whole model.
Usage: `set_pipeline_stage(PipelineStage(rank, size, partition, tp_size))` once per process, before the model;
then `pipeline_stage().layers(num_layers)`, `send_to_next_stage(tensors)`, `recv_from_previous_stage(...)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rapid_llm.config.parallel_config import layer_partition
from rapid_llm.distributed.collective_timer import timed

@dataclass(frozen=True)
class PipelineStage:
    rank: int = 0  # this stage
    size: int = 1  # stages
    partition: tuple[int, ...] | None = None  # layers per stage (None: even, decided by the model's depth)
    tp_size: int = 1  # ranks per stage

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def layers(self, num_layers: int) -> range:
        """The decoder layers this stage holds."""
        counts = layer_partition(num_layers, self.size, self.partition)
        start = sum(counts[: self.rank])
        return range(start, start + counts[self.rank])

    @property
    def last_stage_rank(self) -> int:
        """The global rank that samples and reports results: the last stage's first tensor-parallel rank."""
        return (self.size - 1) * self.tp_size


_stage = PipelineStage()


def set_pipeline_stage(stage: PipelineStage) -> None:
    global _stage
    _stage = stage


_sampling_group: dist.ProcessGroup | None = None  # the ranks that record samples; None: the world


def set_sampling_group(group: dist.ProcessGroup | None) -> None:
    """Ranks outside the model's stages (attention-FFN disaggregation's FFN ranks) record no samples: the group of
    the others."""
    global _sampling_group
    _sampling_group = group


def pipeline_stage() -> PipelineStage:
    return _stage


def send_to_next_stage(tensors: Sequence[torch.Tensor]) -> None:
    """Hand `tensors` to the same tensor-parallel rank of the next stage (it knows their shapes from the plan)."""
    peer = dist.get_rank() + _stage.tp_size
    with timed(tensors[0].device):
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=peer)


def recv_from_previous_stage(count: int, shape: tuple[int, ...], dtype: torch.dtype,
                             device: torch.device) -> list[torch.Tensor]:
    """`count` tensors of `shape` from the same tensor-parallel rank of the previous stage."""
    peer = dist.get_rank() - _stage.tp_size
    received = [torch.empty(shape, dtype=dtype, device=device) for _ in range(count)]
    with timed(device):
        for tensor in received:
            dist.recv(tensor, src=peer)
    return received


def broadcast_sampled(tensor: torch.Tensor, async_op: bool = False) -> dist.Work | None:
    """Every rank's `tensor` becomes the sampling rank's (in place): the tokens every stage and tensor-parallel
    rank records, so random sampling cannot diverge between ranks. Nothing on one rank; with `async_op`, the
    handle to wait on (None when there is nothing to wait for)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    if async_op:
        return dist.broadcast(tensor, _stage.last_stage_rank, group=_sampling_group, async_op=True)
    with timed(tensor.device):
        dist.broadcast(tensor, _stage.last_stage_rank, group=_sampling_group)
    return None
