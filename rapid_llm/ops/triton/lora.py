"""The `lora` op in Triton: shrink then expand over the step's tokens grouped by adapter slot (ops/multi_lora.py).

Both launches have the grid (token blocks, output blocks, slots), sized from the token count alone so nothing is
read back to the host: program (m, n, s) takes the m-th BLOCK_M of slot s's tokens and exits at once when the slot
has fewer. The shrink writes x @ A[s].T for a block of ranks into an fp32 [T, R] buffer indexed by sorted position;
the expand reads a block's full rank from it, multiplies by B[s].T in fp32 and adds into out through its strides
(a column slice of a merged output), rounding once. Rows without an adapter are never loaded or stored.
Usage: `lora(x, lora_a, lora_b, indices, out)` on CUDA, as the torch_ref op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm.ops.multi_lora import LoRAIndices, check_lora_args
from rapid_llm.ops.triton.attention_common import dot_operands

_BLOCK_N = 64
_MAX_BLOCK_R = 64  # ranks per shrink program and per expand step; larger ranks take several


@triton.jit
def _slot_block(sorted_tokens_ptr, slot_starts_ptr, BLOCK_M: tl.constexpr):
    """(sorted positions, their tokens, which are real, whether the block is empty) of program (m, *, s)."""
    slot = tl.program_id(2)
    first = tl.load(slot_starts_ptr + slot) + tl.program_id(0) * BLOCK_M
    end = tl.load(slot_starts_ptr + slot + 1)
    positions = first + tl.arange(0, BLOCK_M)
    row_mask = positions < end
    tokens = tl.load(sorted_tokens_ptr + positions, mask=row_mask, other=0)
    return positions, tokens, row_mask, first >= end


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, shrunk_ptr, sorted_tokens_ptr, slot_starts_ptr, in_features, rank, x_row_stride,
                   x_col_stride, a_slot_stride, a_rank_stride, a_col_stride, BLOCK_M: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    positions, tokens, row_mask, empty = _slot_block(sorted_tokens_ptr, slot_starts_ptr, BLOCK_M)
    if empty:  # the grid covers every token for every slot
        return
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rank_mask = ranks < rank
    depth = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tokens[:, None] * x_row_stride + depth[None, :] * x_col_stride
    a_ptrs = (a_ptr + tl.program_id(2).to(tl.int64) * a_slot_stride + ranks[None, :] * a_rank_stride
              + depth[:, None] * a_col_stride)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for start in range(0, in_features, BLOCK_K):
        depth_mask = depth < in_features - start
        xs = tl.load(x_ptrs, mask=row_mask[:, None] & depth_mask[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=depth_mask[:, None] & rank_mask[None, :], other=0.0)
        acc = tl.dot(xs.to(DOT_DTYPE), a.to(DOT_DTYPE), acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * x_col_stride
        a_ptrs += BLOCK_K * a_col_stride
    tl.store(shrunk_ptr + positions[:, None] * rank + ranks[None, :], acc, mask=row_mask[:, None] & rank_mask[None, :])


@triton.jit
def _expand_kernel(shrunk_ptr, b_ptr, out_ptr, sorted_tokens_ptr, slot_starts_ptr, out_features, rank,
                   b_slot_stride, b_row_stride, b_rank_stride, out_row_stride, out_col_stride, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    positions, tokens, row_mask, empty = _slot_block(sorted_tokens_ptr, slot_starts_ptr, BLOCK_M)
    if empty:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < out_features
    ranks = tl.arange(0, BLOCK_R)
    b_ptrs = (b_ptr + tl.program_id(2).to(tl.int64) * b_slot_stride + cols[None, :].to(tl.int64) * b_row_stride
              + ranks[:, None] * b_rank_stride)
    delta = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, rank, BLOCK_R):
        rank_mask = ranks < rank - start
        shrunk = tl.load(shrunk_ptr + positions[:, None] * rank + (start + ranks)[None, :],
                         mask=row_mask[:, None] & rank_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=rank_mask[:, None] & col_mask[None, :], other=0.0)
        # fp32 operands: the shrunk values keep their fp32 sums, and R is too small for the dot to dominate.
        delta = tl.dot(shrunk, b.to(tl.float32), delta, input_precision="ieee")
        b_ptrs += BLOCK_R * b_rank_stride
    out_ptrs = out_ptr + tokens[:, None] * out_row_stride + cols[None, :] * out_col_stride
    mask = row_mask[:, None] & col_mask[None, :]
    current = tl.load(out_ptrs, mask=mask, other=0.0)
    tl.store(out_ptrs, (current.to(tl.float32) + delta).to(out_ptr.dtype.element_ty), mask=mask)


def _block_m(num_tokens: int, num_slots: int) -> int:
    """Tokens per program from the mean per slot: 16 (tl.dot's minimum) for decode, up to 64 for prefill."""
    return min(64, max(16, triton.next_power_of_2(-(-num_tokens // num_slots))))


def lora(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
         out: torch.Tensor) -> None:
    check_lora_args(x, lora_a, lora_b, indices, out)
    num_tokens = x.shape[0]
    num_slots, rank, in_features = lora_a.shape
    if num_tokens == 0:
        return
    out_features = lora_b.shape[1]
    block_m = _block_m(num_tokens, num_slots)
    block_r = min(_MAX_BLOCK_R, max(16, triton.next_power_of_2(rank)))
    dot_dtype, precision = dot_operands(x)
    block_k = 32 if x.element_size() == 4 else 64
    shrunk = torch.empty(num_tokens, rank, dtype=torch.float32, device=x.device)
    token_blocks = triton.cdiv(num_tokens, block_m)
    _shrink_kernel[(token_blocks, triton.cdiv(rank, block_r), num_slots)](
        x, lora_a, shrunk, indices.sorted_tokens, indices.slot_starts, in_features, rank, x.stride(0), x.stride(1),
        lora_a.stride(0), lora_a.stride(1), lora_a.stride(2), BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=block_k,
        DOT_DTYPE=dot_dtype, PRECISION=precision, num_warps=4, num_stages=3)
    _expand_kernel[(token_blocks, triton.cdiv(out_features, _BLOCK_N), num_slots)](
        shrunk, lora_b, out, indices.sorted_tokens, indices.slot_starts, out_features, rank, lora_b.stride(0),
        lora_b.stride(1), lora_b.stride(2), out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=_BLOCK_N,
        BLOCK_R=block_r, num_warps=4, num_stages=2)
