"""LinearMethod: how a quantized linear layer creates, loads and prepares its parameters.

`create_weights(layer)` runs right after the model is built, before loading: it replaces the layer's
model-dtype `weight` by the checkpoint's tensors (shapes and dtypes as the checkpoint stores them), each a
parameter with a `weight_loader(param, tensor, shard_id)`, so the strict loader fills them like any other.
`prepare(layer)` runs once after loading (from `LinearBase.prepare_weights`): it repacks or quantizes and sets
`layer.kernel`, a LinearKernel called as `kernel(x, layer.weight, bias)` in the layer's unchanged forward.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class LinearMethod:
    def create_weights(self, layer: nn.Module) -> None:
        raise NotImplementedError

    def prepare(self, layer: nn.Module) -> None:
        raise NotImplementedError


def set_parameter(layer: nn.Module, name: str, value: torch.Tensor,
                  loader: Callable[[nn.Parameter, torch.Tensor, object], None] | None = None) -> nn.Parameter:
    """Register (or replace) `layer.<name>` as a frozen parameter, with the loader that fills it."""
    param = nn.Parameter(value, requires_grad=False)
    if loader is not None:
        param.weight_loader = loader
    setattr(layer, name, param)
    return param
