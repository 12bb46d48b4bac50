"""Join a worker rank to the engine's torch.distributed group and pick its device.

The launcher chooses one rendezvous per launch (`init_method`, a file:// path inside the launch's private
socket directory, so concurrent servers never meet); every rank calls `init_worker_group` before it builds
the model. Backend follows the device: NCCL on CUDA (rank r computes on cuda:r), gloo on the CPU (all ranks
share the host's cores). With one rank nothing is initialised and collectives stay identities; the layers
read their rank and size from torch.distributed (`parallel_state.py`).
Usage: `init_worker_group(rank, world_size, "file:///tmp/.../dist-init", "cpu")`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def init_worker_group(rank: int, world_size: int, init_method: str, device_type: str) -> None:
    """Make this process tensor-parallel rank `rank` of `world_size` (CUDA: its current device is cuda:rank)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"tensor-parallel rank {rank} is outside [0, {world_size})")
    if world_size > 1:
        if device_type == "cuda":
            visible = torch.cuda.device_count()
            if rank >= visible:
                raise ValueError(f"--tensor-parallel-size {world_size} needs {world_size} CUDA devices, "
                                 f"{visible} visible")
            torch.cuda.set_device(rank)
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)


def leave_worker_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
