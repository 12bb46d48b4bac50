"""Join a worker rank to the engine's torch.distributed group and pick its device.

The launcher chooses one rendezvous per launch (`init_method`: a file:// path inside the launch's private
socket directory, so concurrent servers never meet; multi-node, tcp://HOST:PORT of node 0's --dist-init-addr);
every rank calls `init_worker_group` before it builds the model. Backend follows the device: NCCL on CUDA
(the rank computes on cuda:<its rank on this node>), gloo on the CPU (the node's ranks share its cores). With one rank nothing is initialised and collectives stay identities; the layers
read their rank and size from torch.distributed (`parallel_state.py`).
Usage: `init_worker_group(rank, world_size, "file:///tmp/.../dist-init", "cpu")`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def init_worker_group(rank: int, world_size: int, init_method: str, device_type: str,
                      local_rank: int | None = None) -> None:
    """Make this process tensor-parallel rank `rank` of `world_size`; on CUDA its current device is
    cuda:`local_rank` (its device on this node, `ParallelConfig.device_index`; default `rank`)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"tensor-parallel rank {rank} is outside [0, {world_size})")
    local_rank = rank if local_rank is None else local_rank
    if device_type == "cuda" and (world_size > 1 or local_rank > 0):
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise ValueError(f"rank {rank} of --tensor-parallel-size {world_size} (times --data-parallel-size) "
                             f"needs CUDA device {local_rank} on its node, {visible} visible")
        torch.cuda.set_device(local_rank)
    if world_size > 1:
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)


def leave_worker_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
