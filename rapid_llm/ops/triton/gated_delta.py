"""The `gated_delta_rule` op in Triton: Gated DeltaNet's recurrence, token by token (torch_ref: ops/gated_delta.py).

Key design choice: the recurrent form, one program per (sequence, value head, block of BLOCK_V value columns),
holding that [key dim, BLOCK_V] slice of the state S in registers while it folds the sequence's tokens in one after
another (S = S * exp(g); u = beta * (v - S^T k); S += k u^T; o = S^T q), so S is read and written once per step
whatever the number of tokens. Columns of S evolve independently (k, q and the decay are shared), so the value
blocks need no communication. One form serves decodes and prefills; after a kept token (`metadata.kept`) the slice
is also stored to the kept rows. A narrow block with one warp, as flash-linear-attention's fused recurrent kernel
uses, keeps many programs busy even for one long prefill.
Usage: `output = gated_delta_rule(query, key, value, g, beta, state, metadata)` on CUDA, as the torch_ref op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.state_metadata import StateMetadata
from rapid_llm.ops.tensor_rows import unit_last
from rapid_llm.ops.triton.launch import check_state, token_loop

_BLOCK_V = 8


@triton.jit
def _gated_delta_kernel(query_ptr, key_ptr, value_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, slots_ptr,
                        query_start_ptr, kept_starts_ptr, kept_targets_ptr, query_token_stride, query_head_stride,
                        key_token_stride, key_head_stride, value_token_stride, value_head_stride, g_token_stride,
                        beta_token_stride, state_row_stride, state_head_stride, state_key_stride, out_token_stride,
                        key_dim, value_dim, GROUP: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                        HAS_KEPT: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // GROUP
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_ok, v_ok = dk < key_dim, dv < value_dim
    tile = head * state_head_stride + dk[:, None] * state_key_stride + dv[None, :]
    tile_ok = k_ok[:, None] & v_ok[None, :]
    row = state_ptr + tl.load(slots_ptr + seq) * state_row_stride
    matrix = tl.load(row + tile, mask=tile_ok, other=0.0).to(tl.float32)
    for token in range(tl.load(query_start_ptr + seq), tl.load(query_start_ptr + seq + 1)):
        q = tl.load(query_ptr + token * query_token_stride + key_head * query_head_stride + dk, mask=k_ok, other=0.0)
        k = tl.load(key_ptr + token * key_token_stride + key_head * key_head_stride + dk, mask=k_ok, other=0.0)
        v = tl.load(value_ptr + token * value_token_stride + head * value_head_stride + dv, mask=v_ok, other=0.0)
        decay = tl.exp(tl.load(g_ptr + token * g_token_stride + head).to(tl.float32))
        beta = tl.load(beta_ptr + token * beta_token_stride + head).to(tl.float32)
        q, k = q.to(tl.float32)[:, None], k.to(tl.float32)[:, None]
        matrix *= decay
        write = (v.to(tl.float32) - tl.sum(matrix * k, axis=0)) * beta
        matrix += k * write[None, :]
        tl.store(out_ptr + token * out_token_stride + head * value_dim + dv,
                 tl.sum(matrix * q, axis=0).to(out_ptr.dtype.element_ty), mask=v_ok)
        if HAS_KEPT:
            for entry in range(tl.load(kept_starts_ptr + token), tl.load(kept_starts_ptr + token + 1)):
                tl.store(state_ptr + tl.load(kept_targets_ptr + entry) * state_row_stride + tile,
                         matrix.to(state_ptr.dtype.element_ty), mask=tile_ok)
    tl.store(row + tile, matrix.to(state_ptr.dtype.element_ty), mask=tile_ok)


def gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """query, key [T, Hk, Dk], value [T, Hv, Dv], g, beta [T, Hv]; each sequence continues from its row of `state`
    [rows, Hv, Dk, Dv], which it then updates. Returns [T, Hv, Dv]."""
    num_tokens, num_value_heads, value_dim = value.shape
    num_key_heads, key_dim = key.shape[1:]
    if query.shape != key.shape or num_value_heads % num_key_heads:
        raise ValueError(f"gated_delta_rule: query {tuple(query.shape)} and key {tuple(key.shape)} must match, with "
                         f"a number of key heads dividing the {num_value_heads} value heads")
    check_state("gated_delta_rule", state, (num_value_heads, key_dim, value_dim))
    query, key, value, g, beta = (unit_last(x) for x in (query, key, value, g, beta))
    output = torch.empty(num_tokens, num_value_heads, value_dim, dtype=value.dtype, device=value.device)
    if num_tokens == 0:
        return output
    launch = token_loop(metadata, num_tokens, num_value_heads, value_dim, _BLOCK_V)
    _gated_delta_kernel[launch.grid](
        query, key, value, g, beta, state, output, metadata.slots, metadata.query_start_loc, launch.kept_starts,
        launch.kept_targets, query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), g.stride(0), beta.stride(0), state.stride(0), state.stride(1), state.stride(2),
        output.stride(0), key_dim, value_dim, GROUP=num_value_heads // num_key_heads,
        BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=launch.block, HAS_KEPT=launch.kept_starts is not None,
        num_warps=1)
    return output
