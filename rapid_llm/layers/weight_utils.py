"""The one shape-checked copy every weight loader ends in, and the post-load choice of a GEMM weight's dtype."""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.ops.cpu_half import weight_dtype


def copy_weight(target: torch.Tensor, loaded: torch.Tensor) -> None:
    """Copy (and cast, once) a checkpoint tensor into a parameter slice of the same shape."""
    if target.shape != loaded.shape:
        raise ValueError(f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit {tuple(target.shape)}")
    target.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
    """Loader for parameters stored whole and unsharded (norm weights, biases of replicated layers)."""
    if shard_id is not None:
        raise ValueError(f"parameter is not stacked, yet got shard {shard_id!r}")
    copy_weight(param.data, loaded)


def keep_gemm_weight_in_compute_dtype(module: nn.Module, name: str = "weight") -> None:
    """After loading: give `module.<name>` the dtype `ops.linear` computes in on its device (fp32 for
    half-precision models on CPUs without half GEMMs; see ops/cpu_half.py). A tied weight is untied."""
    weight = getattr(module, name)
    wanted = weight_dtype(weight.device, weight.dtype)
    if wanted != weight.dtype:
        setattr(module, name, nn.Parameter(weight.data.to(wanted), requires_grad=False))
