"""The causal depthwise convolution with per-request state that short-conv and linear-attention layers share.

A sequence's state is its last kernel_size - 1 inputs per channel ([channels, kernel_size - 1], zero when its chunk
starts at token 0, which is the zero padding a full-sequence conv sees). Key design choice: one vectorised pass for
any mix of prefill chunks and decodes -- each sequence's state rows are laid before its tokens in one flat buffer,
every token gathers its window from it, and each sequence's last kernel_size - 1 rows become its new state -- so no
loop runs per sequence or per token. With `metadata.kept` (speculative decoding) the states after those tokens are
kept too.
`ChannelConv` holds the kernel as nn.Conv1d stores it, each tensor-parallel rank its slice of the channels.
Usage: `output = causal_conv(inputs, state, conv.weight[:, 0, :], conv.bias, metadata)` (state rows updated).
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.distributed import get_tp_rank
from rapid_llm.layers.state_layer import StateMetadata
from rapid_llm.layers.weight_utils import copy_weight


def causal_conv(inputs: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                metadata: StateMetadata) -> torch.Tensor:
    """The conv of `inputs` [tokens, channels] with `weight` [channels, kernel] (oldest tap first), each sequence
    continuing from its row of `state` [rows, channels, kernel - 1], which it then updates."""
    history = weight.shape[1] - 1
    num_tokens, num_seqs = inputs.shape[0], metadata.slots.shape[0]
    device = inputs.device
    starts = metadata.query_start_loc
    seq_index = torch.repeat_interleave(torch.arange(num_seqs, device=device), starts[1:] - starts[:-1],
                                        output_size=num_tokens)
    # Sequence i's rows in the flat buffer: its `history` state rows, then its tokens.
    shift = torch.arange(num_seqs, device=device) * history
    token_rows = torch.arange(num_tokens, device=device) + (seq_index + 1) * history
    state_rows = (starts[:-1] + shift).unsqueeze(1) + torch.arange(history, device=device)
    flat = inputs.new_empty(num_tokens + num_seqs * history, inputs.shape[1])
    flat[token_rows] = inputs
    flat[state_rows] = state[metadata.slots].transpose(1, 2).to(inputs.dtype)
    windows = flat[token_rows.unsqueeze(1) + torch.arange(-history, 1, device=device)]  # [tokens, kernel, channels]
    # Products and sum in float32, rounded once, as a conv1d accumulates.
    output = (windows.float() * weight.t().float()).sum(dim=1)
    if bias is not None:
        output = output + bias.float()
    output = output.to(inputs.dtype)
    ends = starts[1:] + shift + history  # one past each sequence's last row
    state[metadata.slots] = flat[ends.unsqueeze(1) - history + torch.arange(history, device=device)].transpose(
        1, 2).to(state.dtype)
    if metadata.kept is not None:
        # The state after a kept token: its last `history` inputs, itself included.
        kept_rows = token_rows[metadata.kept.tokens]
        after = flat[kept_rows.unsqueeze(1) + torch.arange(1 - history, 1, device=device)]
        state[metadata.kept.targets] = after.transpose(1, 2).to(state.dtype)
    return output


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
