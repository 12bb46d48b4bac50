"""The one shape-checked copy every weight loader ends in."""

from __future__ import annotations

import torch
from torch import nn


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
