"""`ChannelConv`: the depthwise kernel of a causal convolution (ops/state_conv.py), held as nn.Conv1d stores it,
and `load_rank_rows`, the loader of the per-head parameters beside it.

Each tensor-parallel rank loads its slice of every chunk of the channels.
Usage: `conv = ChannelConv([key, key, value], kernel, bias=False)`;
`ops.causal_conv(inputs, state, conv.weight[:, 0, :], conv.bias, metadata)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rapid_llm.distributed import get_tp_rank, get_tp_size
from rapid_llm.layers.weight_utils import copy_weight


def load_rank_rows(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
    """This rank's equal slice of the rows (per-head parameters: a rank holds its heads' rows)."""
    rows = param.shape[0]
    copy_weight(param.data, loaded.narrow(0, get_tp_rank() * rows, rows))


class ChannelConv(nn.Module):
    """The depthwise kernel, `weight` [channels, 1, kernel_size] as nn.Conv1d stores it, and its optional bias.
    Its channels are `chunk_sizes` (e.g. q, k, v or x, B, C: the chunks of the projection feeding it), each split
    over tensor-parallel ranks on its own, so a rank's channels line up with its slice of every chunk."""

    def __init__(self, chunk_sizes: Sequence[int], kernel_size: int, bias: bool) -> None:
        super().__init__()
        self.local_sizes = [size // get_tp_size() for size in chunk_sizes]
        channels = sum(self.local_sizes)
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(channels), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        rank, ranks = get_tp_rank(), get_tp_size()
        chunks = loaded.split([size * ranks for size in self.local_sizes])
        copy_weight(param.data, torch.cat([chunk.narrow(0, rank * size, size)
                                           for chunk, size in zip(chunks, self.local_sizes)]))
