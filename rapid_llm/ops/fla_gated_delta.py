"""gated_delta_rule through flash-linear-attention (pypi `flash-linear-attention`, module `fla`): an adapter onto its
chunked kernels, `fla.ops.gated_delta_rule.chunk_gated_delta_rule`, for long prefills.

Key design choice: the step's tokens go in as one variable-length batch (cu_seqlens = query_start_loc, batch 1),
each sequence starting from its state row gathered into fla's initial_state [N, Hv, Dk, Dv] and its final state
scattered back; value heads share key heads as fla's grouped value attention does (h // (Hv / Hk)). fla returns
no state after inner tokens, so a step keeping states (`metadata.kept`) is left to another implementation (its
catalog predicate). The query comes normalised and scaled, hence scale=1. fla is imported by the `available`
probe on first selection, never here: importing this module needs neither fla nor a GPU.
Usage: `output = gated_delta_rule_fla(query, key, value, g, beta, state, metadata)` on CUDA, as the torch_ref op.
"""

from __future__ import annotations

import importlib

import torch

from rapid_llm.ops.state_metadata import StateMetadata


def fla_missing(device_type: str, dtype: str) -> str | None:
    """The `available` condition: fla's kernels import here. An installed fla can still fail to (0.5.2 names an
    autotune key that is no kernel argument, which Triton 3.9 refuses), and that must be a skip, not a crash."""
    try:
        importlib.import_module("fla.ops.gated_delta_rule")
    except Exception as error:  # whatever the library raises at import
        return f"flash-linear-attention does not import: {type(error).__name__}: {error}"
    return None


def gated_delta_rule_fla(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """query, key [T, Hk, Dk], value [T, Hv, Dv], g, beta [T, Hv]; each sequence continues from its row of `state`
    [rows, Hv, Dk, Dv], which it then updates. Returns [T, Hv, Dv]. No kept states (the predicate refuses them)."""
    try:  # optional: imported once selected (the `available` probe has imported it already)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as error:
        raise ImportError(f"this adapter needs the optional library flash-linear-attention: {error}") from error

    output, final_state = chunk_gated_delta_rule(
        query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0), scale=1.0,
        initial_state=state[metadata.slots], output_final_state=True, cu_seqlens=metadata.query_start_loc)
    state[metadata.slots] = final_state.to(state.dtype)
    return output.squeeze(0)
