"""LFM2's gated short convolution, a state-group layer: B, C, x = in_proj(h); y = C * conv(B * x); out_proj(y).

`conv` is causal and depthwise over the last `kernel_size` positions of B * x (ops/state_conv.py), so a
request's state is the last kernel_size - 1 of those inputs per channel. Channels are split over tensor-parallel
ranks (each chunk of in_proj on its own, and the conv kernel).
Usage: `ShortConv(hidden_size, kernel_size, bias)` as a decoder layer's mixer, called (hidden_states, batch).
"""

from __future__ import annotations

import torch

from rapid_llm import ops
from rapid_llm.distributed import get_tp_size
from rapid_llm.layers.causal_conv import ChannelConv
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.linear import ChunkedColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.ops.attention.kv_cache_spec import StateSpec
from rapid_llm.ops.state_metadata import StateMetadata


class ShortConv(StateLayer):
    def __init__(self, hidden_size: int, kernel_size: int, bias: bool) -> None:
        super().__init__()
        self.in_proj = ChunkedColumnParallelLinear(hidden_size, [hidden_size] * 3, bias=bias)
        self.channels = hidden_size // get_tp_size()
        self.kernel_size = kernel_size
        self.conv = ChannelConv([hidden_size], kernel_size, bias)
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias=bias)

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        return StateSpec(dtype, ((self.channels, self.kernel_size - 1),))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        metadata: StateMetadata = batch.metadata_for(self)
        b, c, x = self.in_proj(hidden_states).chunk(3, dim=-1)
        (state,) = self.bound()
        mixed = ops.causal_conv(b * x, state, self.conv.weight[:, 0, :], self.conv.bias, metadata)
        return self.out_proj(c * mixed)
