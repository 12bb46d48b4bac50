"""Op cases of the state ops (causal_conv, gated_delta_rule, ssd_scan): a step's sequences over rows of a state tensor.

Variants: "decode" (one token per sequence, `num_tokens` sequences, the first one's state kept), "mixed" (a
prefill of over one 64-token chunk that keeps the states after its 16th and last tokens, as state snapshots do, a
chunk continuing from its state, a fresh chunk, a decode) and "verify" (two chunks verifying drafts, the state after each of their tokens kept, as
speculative decoding keeps them). Each implementation runs only where its predicate holds (the decode form on
"decode", the chunked form on "mixed"); torch_ref runs on all.
Usage: `STATE_OP_CASES["gated_delta_rule"].build(config, "mixed")`.
"""

from __future__ import annotations

import torch

from rapid_llm.ops.op_case_inputs import CaseConfig, CaseInputs, OpCase, OpInputs
from rapid_llm.ops.state_metadata import StateMetadata, kept_states

_CONV_KERNEL = 4


def _state_step(inputs: CaseInputs, variant: str) -> tuple[StateMetadata, int]:
    """The step's metadata over shuffled rows (and how many rows the state tensor has)."""
    t, device = inputs.config.num_tokens, inputs.config.device
    if variant == "decode":
        # The first sequence keeps its state, as a decode ending a block does for a snapshot.
        lengths, fresh, kept = [1] * t, [False] * t, [(0, 0, 0)]
    elif variant == "mixed":
        long = 64 + t + 3
        lengths, fresh, kept = [long, t, t + 2, 1], [True, False, True, False], [(0, 15, 0), (0, long - 1, 1)]
    else:
        draft = min(t, 3) + 1
        lengths, fresh = [draft, 1, draft], [False] * 3
        kept = [(seq, offset, 4 * seq + offset) for seq in (0, 2) for offset in range(draft)]
    # Kept states go to rows below 16, the sequences' own rows are shuffled above.
    num_rows = 16 + 2 * len(lengths)
    slots = inputs.randperm(num_rows - 16)[:len(lengths)] + 16
    query_lens = torch.tensor(lengths, device=device)
    starts = torch.nn.functional.pad(query_lens.cumsum(0), (1, 0))
    metadata = StateMetadata(slots, torch.repeat_interleave(slots, query_lens), starts,
                             ~torch.tensor(fresh, device=device), max(lengths), kept_states(lengths, kept, device))
    return metadata, num_rows


def _zero_fresh_rows(state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """The state group zeroes a fresh sequence's row before the forward; the cases start from that too."""
    state[metadata.slots[~metadata.has_initial_state]] = 0
    return state


def _causal_conv(config: CaseConfig, variant: str) -> OpInputs:
    inputs, channels = CaseInputs(config), config.shape.hidden_size
    metadata, num_rows = _state_step(inputs, variant)
    num_tokens = int(metadata.query_start_loc[-1])
    state = _zero_fresh_rows(inputs.randn(num_rows, channels, _CONV_KERNEL - 1), metadata)
    args = (inputs.randn(num_tokens, channels), state, inputs.randn(channels, _CONV_KERNEL, scale=0.5),
            inputs.randn(channels), metadata)
    return OpInputs(args, f"[{num_tokens}, {channels}] k{_CONV_KERNEL}")


def _gated_delta_rule(config: CaseConfig, variant: str) -> OpInputs:
    """Qwen3-Next's head layout at the shape's widths: key heads = KV heads, value heads = heads."""
    inputs, shape = CaseInputs(config), config.shape
    metadata, num_rows = _state_step(inputs, variant)
    num_tokens = int(metadata.query_start_loc[-1])
    k_heads, v_heads, dim = shape.num_kv_heads, shape.num_heads, shape.head_dim

    def normalised(x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)

    state = _zero_fresh_rows(inputs.randn(num_rows, v_heads, dim, dim, scale=0.1), metadata)
    args = (normalised(inputs.randn(num_tokens, k_heads, dim)) * dim**-0.5, normalised(inputs.randn(num_tokens,
            k_heads, dim)), inputs.randn(num_tokens, v_heads, dim), -inputs.randn(num_tokens, v_heads).abs() * 0.2,
            inputs.randn(num_tokens, v_heads).sigmoid(), state, metadata)
    return OpInputs(args, f"[{num_tokens}, {k_heads}/{v_heads}, {dim}]")


def _ssd_scan(config: CaseConfig, variant: str) -> OpInputs:
    """Mamba2's layout at the shape's widths: heads, KV heads as B/C groups, head_dim as head and state dim; x, dt,
    B, C and D in the model dtype, A and the state in float32 (as the mixer passes them)."""
    inputs, shape = CaseInputs(config), config.shape
    metadata, num_rows = _state_step(inputs, variant)
    num_tokens = int(metadata.query_start_loc[-1])
    heads, groups, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
    state = _zero_fresh_rows(inputs.randn(num_rows, heads, dim, dim, scale=0.1, dtype=torch.float32), metadata)
    dt = torch.nn.functional.softplus(inputs.randn(num_tokens, heads, dtype=torch.float32) - 1).to(config.dtype)
    args = (inputs.randn(num_tokens, heads, dim), dt, -inputs.randn(heads, scale=0.5, dtype=torch.float32).exp(),
            inputs.randn(num_tokens, groups, dim, scale=dim**-0.5), inputs.randn(num_tokens, groups, dim,
            scale=dim**-0.5), inputs.randn(heads), state, metadata)
    return OpInputs(args, f"[{num_tokens}, {heads}, {dim}] {groups} groups, state {dim}")


_VARIANTS = ("decode", "mixed", "verify")
STATE_OP_CASES: dict[str, OpCase] = {
    "causal_conv": OpCase(_causal_conv, variants=_VARIANTS),
    "gated_delta_rule": OpCase(_gated_delta_rule, variants=_VARIANTS, dtypes=("float32",),
                               why_dtypes="Gated DeltaNet runs the rule and keeps its state in float32"),
    "ssd_scan": OpCase(_ssd_scan, variants=_VARIANTS),
}
