"""The causal depthwise convolution with per-request state that short-conv, linear-attention and Mamba layers share
(op `causal_conv`; this is its torch_ref).

A sequence's state is its last kernel_size - 1 inputs per channel ([channels, kernel_size - 1], zero when its chunk
starts at token 0, which is the zero padding a full-sequence conv sees). Key design choice: one vectorised pass for
any mix of prefill chunks and decodes -- each sequence's state rows are laid before its tokens in one flat buffer,
every token gathers its window from it, and each sequence's last kernel_size - 1 rows become its new state -- so no
loop runs per sequence or per token. With `metadata.kept` (speculative decoding) the states after those tokens are
kept too. `causal_conv_decode` is the form for steps of one token per sequence.
Usage: `output = ops.causal_conv(inputs, state, weight, bias, metadata)` (state rows updated in place).
"""

from __future__ import annotations

import torch

from rapid_llm.ops.state_metadata import StateMetadata


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


def causal_conv_decode(inputs: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       metadata: StateMetadata) -> torch.Tensor:
    """One token per sequence (token i is sequence i's): the taps as fused multiply-adds over [sequences,
    channels] in float32, the state shifted by one input."""
    history = state[metadata.slots]  # [n, channels, kernel - 1]
    weight = weight.float()
    output = inputs.float() * weight[:, -1]
    for tap in range(history.shape[-1]):
        output.addcmul_(history[..., tap].float(), weight[:, tap])
    if bias is not None:
        output = output + bias.float()
    window = torch.cat([history[..., 1:], inputs.unsqueeze(-1).to(state.dtype)], dim=-1)
    state[metadata.slots] = window
    if metadata.kept is not None:
        state[metadata.kept.targets] = window[metadata.kept.tokens]
    return output.to(inputs.dtype)
