"""LFM2's gated short convolution, a state-group layer: B, C, x = in_proj(h); y = C * conv(B * x); out_proj(y).

`conv` is causal and depthwise over the last `kernel_size` positions of B * x, so a request's state is the last
kernel_size - 1 of those inputs per channel ([channels, kernel_size - 1], zero when its chunk starts at token 0,
which is the zero padding transformers' conv sees). Key design choice: one vectorised pass for any mix of prefill
chunks and decodes -- each sequence's state rows are laid before its tokens in one flat buffer, every token gathers
its window from it, and each sequence's last kernel_size - 1 rows become its new state -- so no loop runs per
sequence or per token. Channels are split over tensor-parallel ranks (each chunk of in_proj on its own).
Usage: `ShortConv(hidden_size, kernel_size, bias)` as a decoder layer's mixer, called (hidden_states, batch).
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.distributed import get_tp_rank, get_tp_size
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.linear import ChunkedColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.state_layer import StateLayer, StateMetadata
from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.attention.kv_cache_spec import StateSpec


class ChannelConv(nn.Module):
    """The depthwise kernel, `weight` [channels, 1, kernel_size] as nn.Conv1d stores it, and its optional bias;
    each rank loads its slice of the channels."""

    def __init__(self, channels: int, kernel_size: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(channels), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    @staticmethod
    def weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        channels = param.shape[0]
        copy_weight(param.data, loaded.narrow(0, get_tp_rank() * channels, channels))


class ShortConv(StateLayer):
    def __init__(self, hidden_size: int, kernel_size: int, bias: bool) -> None:
        super().__init__()
        self.in_proj = ChunkedColumnParallelLinear(hidden_size, [hidden_size] * 3, bias=bias)
        self.channels = hidden_size // get_tp_size()
        self.kernel_size = kernel_size
        self.conv = ChannelConv(self.channels, kernel_size, bias)
        self.out_proj = RowParallelLinear(hidden_size, hidden_size, bias=bias)

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        return StateSpec(dtype, ((self.channels, self.kernel_size - 1),))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        metadata: StateMetadata = batch.metadata_for(self)
        b, c, x = self.in_proj(hidden_states).chunk(3, dim=-1)
        mixed = self._convolve(b * x, metadata)
        return self.out_proj(c * mixed)

    def _convolve(self, inputs: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
        """The causal depthwise conv of `inputs` [tokens, channels], each sequence continuing from its state row."""
        (state,) = self.bound()
        history = self.kernel_size - 1
        num_tokens, num_seqs = inputs.shape[0], metadata.slots.shape[0]
        device = inputs.device
        starts = metadata.query_start_loc
        seq_index = torch.repeat_interleave(torch.arange(num_seqs, device=device), starts[1:] - starts[:-1],
                                            output_size=num_tokens)
        # Sequence i's rows in the flat buffer: its `history` state rows, then its tokens.
        shift = torch.arange(num_seqs, device=device) * history
        token_rows = torch.arange(num_tokens, device=device) + (seq_index + 1) * history
        state_rows = (starts[:-1] + shift).unsqueeze(1) + torch.arange(history, device=device)
        flat = inputs.new_empty(num_tokens + num_seqs * history, self.channels)
        flat[token_rows] = inputs
        flat[state_rows] = state[metadata.slots].transpose(1, 2).to(inputs.dtype)
        windows = flat[token_rows.unsqueeze(1) + torch.arange(-history, 1, device=device)]  # [tokens, kernel, ch]
        weight = self.conv.weight[:, 0, :].t()  # [kernel, channels]
        output = (windows * weight).sum(dim=1)
        if self.conv.bias is not None:
            output = output + self.conv.bias
        ends = starts[1:] + shift + history  # one past each sequence's last row
        state[metadata.slots] = flat[ends.unsqueeze(1) - history + torch.arange(history, device=device)].transpose(
            1, 2).to(state.dtype)
        return output
