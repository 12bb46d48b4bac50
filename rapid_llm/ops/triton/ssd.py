"""The `ssd_scan` op in Triton: Mamba2's selective state update, token by token (torch_ref: ops/ssd.py).

Key design choice: the recurrent form, one program per (sequence, head, block of BLOCK_P rows of the head dim),
holding that [BLOCK_P, state dim] slice of the state S in registers while it folds the sequence's tokens in one
after another (S = S * exp(dt A); S += dt B x; y = S C + D x), so S is read and written once per step whatever the
number of tokens. Rows of S evolve independently (B, C and the decay are shared), so the blocks need no
communication. One form serves decodes and prefills; after a kept token (`metadata.kept`) the slice is also stored
to the kept rows. x, dt, B, C and D may be in the model dtype; everything is computed in float32 and y is float32,
as the reference's. A narrow block with one warp, as the gated delta rule's kernel, keeps many programs busy even
for one long prefill.
Usage: `y = ssd_scan(x, dt, A, B, C, D, state, metadata)` on CUDA, as the torch_ref op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.state_metadata import StateMetadata
from rapid_llm.ops.tensor_rows import unit_last
from rapid_llm.ops.triton.launch import check_state, token_loop

_BLOCK_P = 8


@triton.jit
def _ssd_kernel(x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, state_ptr, out_ptr, slots_ptr, query_start_ptr,
                kept_starts_ptr, kept_targets_ptr, x_token_stride, x_head_stride, dt_token_stride, B_token_stride,
                B_group_stride, C_token_stride, C_group_stride, state_row_stride, state_head_stride,
                state_head_dim_stride, out_token_stride, head_dim, state_dim, GROUP: tl.constexpr,
                BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_KEPT: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    group = head // GROUP
    dp = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    dn = tl.arange(0, BLOCK_N)
    p_ok, n_ok = dp < head_dim, dn < state_dim
    tile = head * state_head_stride + dp[:, None] * state_head_dim_stride + dn[None, :]
    tile_ok = p_ok[:, None] & n_ok[None, :]
    row = state_ptr + tl.load(slots_ptr + seq) * state_row_stride
    matrix = tl.load(row + tile, mask=tile_ok, other=0.0).to(tl.float32)
    a = tl.load(A_ptr + head).to(tl.float32)
    skip = tl.load(D_ptr + head).to(tl.float32)
    for token in range(tl.load(query_start_ptr + seq), tl.load(query_start_ptr + seq + 1)):
        x = tl.load(x_ptr + token * x_token_stride + head * x_head_stride + dp, mask=p_ok, other=0.0).to(tl.float32)
        b = tl.load(B_ptr + token * B_token_stride + group * B_group_stride + dn, mask=n_ok, other=0.0)
        c = tl.load(C_ptr + token * C_token_stride + group * C_group_stride + dn, mask=n_ok, other=0.0)
        dt = tl.load(dt_ptr + token * dt_token_stride + head).to(tl.float32)
        # The reference's order of operations: the decayed state plus (dt B) x.
        matrix = matrix * tl.exp(dt * a) + (dt * b.to(tl.float32))[None, :] * x[:, None]
        y = tl.sum(matrix * c.to(tl.float32)[None, :], axis=1) + skip * x
        tl.store(out_ptr + token * out_token_stride + head * head_dim + dp, y, mask=p_ok)
        if HAS_KEPT:
            for entry in range(tl.load(kept_starts_ptr + token), tl.load(kept_starts_ptr + token + 1)):
                tl.store(state_ptr + tl.load(kept_targets_ptr + entry) * state_row_stride + tile,
                         matrix.to(state_ptr.dtype.element_ty), mask=tile_ok)
    tl.store(row + tile, matrix.to(state_ptr.dtype.element_ty), mask=tile_ok)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
    """x [T, H, P], dt [T, H], A, D [H], B, C [T, G, N]; each sequence continues from its row of `state`
    [rows, H, P, N], which it then updates. Returns float32 [T, H, P]."""
    num_tokens, num_heads, head_dim = x.shape
    num_groups, state_dim = B.shape[1:]
    if C.shape != B.shape or B.shape[0] != num_tokens or num_heads % num_groups:
        raise ValueError(f"ssd_scan: B {tuple(B.shape)} and C {tuple(C.shape)} must match, with {num_tokens} tokens "
                         f"and a number of groups dividing the {num_heads} heads")
    check_state("ssd_scan", state, (num_heads, head_dim, state_dim))
    x, dt, B, C = (unit_last(tensor) for tensor in (x, dt, B, C))
    A, D = A.contiguous(), D.contiguous()
    output = torch.empty(num_tokens, num_heads, head_dim, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return output
    launch = token_loop(metadata, num_tokens, num_heads, head_dim, _BLOCK_P)
    _ssd_kernel[launch.grid](
        x, dt, A, B, C, D, state, output, metadata.slots, metadata.query_start_loc, launch.kept_starts,
        launch.kept_targets, x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0),
        C.stride(1), state.stride(0), state.stride(1), state.stride(2), output.stride(0), head_dim, state_dim,
        GROUP=num_heads // num_groups, BLOCK_P=launch.block, BLOCK_N=triton.next_power_of_2(state_dim),
        HAS_KEPT=launch.kept_starts is not None, num_warps=1)
    return output
