"""The `causal_conv` op in Triton: the causal depthwise conv of state layers, each sequence continuing from its state
row (torch_ref and its rounding: ops/state_conv.py).

Key design choice: one program per (sequence, block of BLOCK_T of its tokens, block of channels), each token reading
its kernel_size taps from the inputs or, before the sequence's first token, from its old state row, so a long
prefill spreads over as many programs as a batch of decodes. Since BLOCK_T >= kernel_size - 1, only a sequence's
first token block reads its old state; that program also writes the new one (the last kernel_size - 1 inputs, older
first) behind a barrier after its reads, so no program reads a row another overwrites. A kept state (`metadata.kept`)
is written by the program holding its token.
Usage: `output = causal_conv(inputs, state, weight, bias, metadata)` on CUDA, as the torch_ref op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.state_metadata import StateMetadata
from rapid_llm.ops.tensor_rows import rows_of
from rapid_llm.ops.triton.launch import kept_by_token, warps_for

_MAX_BLOCK_T = 32


@triton.jit
def _window(inputs_ptr, state_row, start, source, valid, channel, channel_ok, inputs_token_stride,
            KERNEL: tl.constexpr):
    """The inputs at sequence positions `source` (where `valid`) as a [channels, positions] tile in the inputs'
    dtype; a position before the sequence's first token reads entry KERNEL - 1 + position of its old state row."""
    from_inputs = source >= 0
    fresh = tl.load(inputs_ptr + (start + source)[None, :] * inputs_token_stride + channel[:, None],
                    mask=channel_ok[:, None] & (valid & from_inputs)[None, :], other=0.0)
    old = tl.load(state_row[:, None] + (source + KERNEL - 1)[None, :],
                  mask=channel_ok[:, None] & (valid & ~from_inputs)[None, :], other=0.0)
    # The reference lays the old state into a buffer of the inputs' dtype: round it the same way.
    return tl.where(from_inputs[None, :], fresh, old.to(fresh.dtype))


@triton.jit
def _causal_conv_kernel(inputs_ptr, state_ptr, weight_ptr, bias_ptr, out_ptr, slots_ptr, query_start_ptr,
                        kept_starts_ptr, kept_tokens_ptr, kept_targets_ptr, inputs_token_stride, state_row_stride,
                        state_channel_stride, weight_channel_stride, channels, KERNEL: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, HAS_BIAS: tl.constexpr,
                        HAS_KEPT: tl.constexpr):
    seq = tl.program_id(0)
    block = tl.program_id(1)
    start = tl.load(query_start_ptr + seq)
    length = tl.load(query_start_ptr + seq + 1) - start
    first = block * BLOCK_T
    if first >= length:  # the grid covers the longest sequence of the step
        return
    channel = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_ok = channel < channels
    state_row = state_ptr + tl.load(slots_ptr + seq) * state_row_stride + channel * state_channel_stride
    position = first + tl.arange(0, BLOCK_T)
    valid = position < length
    # Products and sum in float32, rounded once, as the reference (and a conv1d) accumulates.
    total = tl.zeros([BLOCK_C, BLOCK_T], dtype=tl.float32)
    for tap in tl.static_range(KERNEL):
        window = _window(inputs_ptr, state_row, start, position + tap - (KERNEL - 1), valid, channel, channel_ok,
                         inputs_token_stride, KERNEL)
        weight = tl.load(weight_ptr + channel * weight_channel_stride + tap, mask=channel_ok, other=0.0)
        total += window.to(tl.float32) * weight.to(tl.float32)[:, None]
    if HAS_BIAS:
        total += tl.load(bias_ptr + channel, mask=channel_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + (start + position)[None, :] * channels + channel[:, None], total.to(out_ptr.dtype.element_ty),
             mask=channel_ok[:, None] & valid[None, :])
    # A state is the KERNEL - 1 inputs ending at its token, older first.
    history = tl.arange(0, BLOCK_H)
    history_ok = history < KERNEL - 1
    state_tile = (channel * state_channel_stride)[:, None] + history[None, :]
    state_mask = channel_ok[:, None] & history_ok[None, :]
    if HAS_KEPT:
        last = tl.minimum(first + BLOCK_T, length)
        for entry in range(tl.load(kept_starts_ptr + start + first), tl.load(kept_starts_ptr + start + last)):
            kept = _window(inputs_ptr, state_row, start, tl.load(kept_tokens_ptr + entry) - start + history
                           - (KERNEL - 2), history_ok, channel, channel_ok, inputs_token_stride, KERNEL)
            tl.store(state_ptr + tl.load(kept_targets_ptr + entry) * state_row_stride + state_tile,
                     kept.to(state_ptr.dtype.element_ty), mask=state_mask)
    if block == 0:
        new_state = _window(inputs_ptr, state_row, start, length - 1 + history - (KERNEL - 2), history_ok, channel,
                            channel_ok, inputs_token_stride, KERNEL)
        # Every read of the old row (this program's alone) must land before any thread overwrites it.
        tl.debug_barrier()
        tl.store(state_row[:, None] + history[None, :], new_state.to(state_ptr.dtype.element_ty), mask=state_mask)


def causal_conv(inputs: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                metadata: StateMetadata) -> torch.Tensor:
    """The conv of `inputs` [tokens, channels] with `weight` [channels, kernel] (oldest tap first), each sequence
    continuing from its row of `state` [rows, channels, kernel - 1], which it then updates."""
    num_tokens, channels = inputs.shape
    kernel_size = weight.shape[1]
    if weight.shape[0] != channels or state.shape[1:] != (channels, kernel_size - 1):
        raise ValueError(f"causal_conv: weight {tuple(weight.shape)} and state {tuple(state.shape)} do not match "
                         f"inputs of {channels} channels (state: [rows, channels, kernel - 1])")
    if state.stride(2) != 1:
        raise ValueError("causal_conv: the state is updated in place, so its last dim must be contiguous")
    output = torch.empty(num_tokens, channels, dtype=inputs.dtype, device=inputs.device)
    if num_tokens == 0:
        return output
    inputs, weight = rows_of(inputs), rows_of(weight)
    # Decodes take a few token rows and many channels per program, prefills a 2-d tile.
    block_t = max(min(_MAX_BLOCK_T, triton.next_power_of_2(metadata.max_query_len)),
                  triton.next_power_of_2(kernel_size - 1))
    block_c = min(triton.next_power_of_2(channels), max(64, 1024 // block_t))
    kept = kept_by_token(metadata, num_tokens)
    kept_starts, kept_tokens, kept_targets = kept if kept is not None else (None, None, None)
    grid = (metadata.slots.shape[0], triton.cdiv(metadata.max_query_len, block_t), triton.cdiv(channels, block_c))
    _causal_conv_kernel[grid](
        inputs, state, weight, bias, output, metadata.slots, metadata.query_start_loc, kept_starts, kept_tokens,
        kept_targets, inputs.stride(0), state.stride(0), state.stride(1), weight.stride(0), channels,
        KERNEL=kernel_size, BLOCK_T=block_t, BLOCK_C=block_c, BLOCK_H=triton.next_power_of_2(kernel_size - 1),
        HAS_BIAS=bias is not None, HAS_KEPT=kept is not None, num_warps=warps_for(block_t * block_c))
    return output
