"""Join a worker rank to the engine's torch.distributed group and pick its device.

The launcher chooses one rendezvous per launch (`init_method`: a file:// path inside the launch's private
socket directory, so concurrent servers never meet; multi-node, tcp://HOST:PORT of node 0's --dist-init-addr);
every rank calls `init_worker_group` before it builds the model. Backend follows the device: NCCL on CUDA
(the rank computes on cuda:<its rank on this node>), gloo on the CPU (the node's ranks share its cores). With
one rank nothing is initialised and collectives stay identities. With pipeline stages each stage's block of
ranks becomes a tensor-parallel group of its own (every rank creates every group, as torch.distributed needs),
and the stage is recorded for the model to read (`pipeline.py`); with decode context parallelism blocks of
`dcp_size` ranks form DCP groups; with prefill context parallelism `pcp_size` tensor-parallel groups of replicas
and the PCP groups across them; with attention-FFN disaggregation the attention ranks and the FFN ranks after them
are a TP group each (distributed/ffn_exchange.py). The layers read their tensor-parallel rank and size through
`parallel_state.py`.
Usage: `init_worker_group(rank, world_size, "file:///tmp/.../dist-init", "cpu", stage=PipelineStage(...))`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rapid_llm.distributed.ffn_exchange import set_attention_ranks
from rapid_llm.distributed.parallel_state import set_dcp_group, set_pcp_group, set_tp_group
from rapid_llm.distributed.pipeline import PipelineStage, set_pipeline_stage, set_sampling_group


def init_worker_group(rank: int, world_size: int, init_method: str, device_type: str,
                      local_rank: int | None = None, stage: PipelineStage | None = None,
                      dcp_size: int = 1, pcp_size: int = 1, ffn_ranks: int = 0) -> None:
    """Make this process rank `rank` of `world_size` (of pipeline `stage`, default the only one); on CUDA its
    current device is cuda:`local_rank` (its device on this node, `ParallelConfig.device_index`; default
    `rank`). `ffn_ranks` > 0: attention-FFN disaggregation's FFN ranks follow, ranks [world_size, world_size +
    ffn_ranks), one TP group of their own (the attention ranks are the other)."""
    if ffn_ranks:
        _init_disaggregated(rank, world_size, ffn_ranks, init_method, device_type, local_rank)
        return
    if not 0 <= rank < world_size:
        raise ValueError(f"tensor-parallel rank {rank} is outside [0, {world_size})")
    local_rank = rank if local_rank is None else local_rank
    if device_type == "cuda" and (world_size > 1 or local_rank > 0):
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise ValueError(f"rank {rank} of --tensor-parallel-size {world_size} (times --data-parallel-size) "
                             f"needs CUDA device {local_rank} on its node, {visible} visible")
        torch.cuda.set_device(local_rank)
    stage = stage or PipelineStage(tp_size=world_size)
    if stage.size * stage.tp_size != world_size or rank // stage.tp_size != stage.rank:
        raise ValueError(f"rank {rank} of {world_size} is not in pipeline stage {stage.rank} of {stage.size} "
                         f"stages of {stage.tp_size} ranks")
    set_pipeline_stage(stage)
    if world_size > 1:
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    if stage.size > 1:
        groups = [dist.new_group(list(range(first, first + stage.tp_size)))
                  for first in range(0, world_size, stage.tp_size)]
        set_tp_group(groups[stage.rank])
    if pcp_size > 1:
        # One stage of pcp_size tensor-parallel groups (blocks of tp ranks); a PCP group: one rank of each.
        tp = world_size // pcp_size
        tp_groups = [dist.new_group(list(range(first, first + tp))) for first in range(0, world_size, tp)]
        pcp_groups = [dist.new_group(list(range(tp_rank, world_size, tp))) for tp_rank in range(tp)]
        set_tp_group(tp_groups[rank // tp])
        set_pcp_group(pcp_groups[rank % tp])
    if dcp_size > 1:
        # Blocks of consecutive ranks, inside each stage's tensor-parallel group (dcp_size divides tp_size).
        dcp_groups = [dist.new_group(list(range(first, first + dcp_size))) for first in range(0, world_size, dcp_size)]
        set_dcp_group(dcp_groups[rank // dcp_size])


def _init_disaggregated(rank: int, attention_ranks: int, ffn_ranks: int, init_method: str, device_type: str,
                        local_rank: int | None) -> None:
    if device_type == "cuda":
        torch.cuda.set_device(rank if local_rank is None else local_rank)
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=attention_ranks + ffn_ranks)
    groups = [dist.new_group(list(range(attention_ranks))),
              dist.new_group(list(range(attention_ranks, attention_ranks + ffn_ranks)))]
    set_tp_group(groups[rank >= attention_ranks])
    set_sampling_group(groups[0])
    set_pipeline_stage(PipelineStage(tp_size=attention_ranks))
    set_attention_ranks(attention_ranks)


def leave_worker_group() -> None:
    set_tp_group(None)
    set_dcp_group(None)
    set_pcp_group(None)
    set_pipeline_stage(PipelineStage())
    set_sampling_group(None)
    if dist.is_initialized():
        dist.destroy_process_group()
