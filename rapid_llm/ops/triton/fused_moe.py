"""fused_moe in Triton: grouped GEMMs over token slots sorted by expert (moe_align.py), then a top-k sum.

One launch per projection: each program multiplies one block of BLOCK_M slots (all of one expert, rows
gathered from the token rows) by a BLOCK_N slice of that expert's weight, accumulating in fp32. The w13
output goes through `ops.silu_and_mul`; the w2 launch also applies the routing weight. Rounding follows
the torch reference (moe.py): each GEMM's output is rounded to the activation dtype, the w2 output times
its routing weight is rounded again, and a token's expert outputs are summed in expert order, rounding
after each add. GEMMs sum in another order than torch's, so results agree within a few roundings.
Usage: `fused_moe(x [T, H], topk_weights [T, k], topk_ids [T, k], w13 [E, 2I, H], w2 [E, H, I])`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rapid_llm import ops
from rapid_llm.ops.activation import clamped_silu_and_mul
from rapid_llm.ops.moe_kernel import CheckpointLayoutMoE
from rapid_llm.ops.tensor_rows import rows_of
from rapid_llm.ops.triton.attention_common import dot_operands
from rapid_llm.ops.triton.launch import warps_for
from rapid_llm.ops.triton.moe_align import align_slots

_BLOCK_N = 64
_SUM_BLOCK = 1024


@triton.jit
def _grouped_gemm_kernel(a_ptr, b_ptr, out_ptr, sorted_slots_ptr, block_experts_ptr, weights_ptr, num_slots,
                         num_experts, n, k, a_row_stride, b_expert_stride, b_n_stride, b_k_stride, out_row_stride,
                         SLOTS_PER_ROW: tl.constexpr, APPLY_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr,
                         PRECISION: tl.constexpr):
    expert = tl.load(block_experts_ptr + tl.program_id(0))
    if expert >= num_experts:  # past the last expert's blocks: the grid is sized for the worst case
        return
    slots = tl.load(sorted_slots_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))
    row_mask = slots < num_slots  # padding rows hold the sentinel num_slots
    a_rows = (slots // SLOTS_PER_ROW).to(tl.int64)  # w13 reads token rows, w2 the slot rows
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n
    depth = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * a_row_stride + depth[None, :]
    # int64: E * 2I * H passes 2^31 for large models.
    b_ptrs = (b_ptr + expert.to(tl.int64) * b_expert_stride + cols[None, :].to(tl.int64) * b_n_stride
              + depth[:, None] * b_k_stride)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k, BLOCK_K):
        depth_mask = depth < k - start
        a = tl.load(a_ptrs, mask=row_mask[:, None] & depth_mask[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=depth_mask[:, None] & col_mask[None, :], other=0.0)
        acc = tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * b_k_stride
    out = acc.to(out_ptr.dtype.element_ty)
    if APPLY_WEIGHT:  # the reference's product in the weights' dtype, rounded to the activation dtype
        weights = tl.load(weights_ptr + slots, mask=row_mask, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) * weights[:, None]).to(out_ptr.dtype.element_ty)
    out_offsets = slots[:, None].to(tl.int64) * out_row_stride + cols[None, :]
    tl.store(out_ptr + out_offsets, out, mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _sum_kernel(slot_out_ptr, order_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):  # in expert order, rounding each partial sum like index_add_
        slot = token * TOP_K + tl.load(order_ptr + token * TOP_K + j)
        value = tl.load(slot_out_ptr + slot * hidden + cols, mask=mask, other=0.0).to(tl.float32)
        acc = (acc + value).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + token * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _block_m(num_slots: int, num_experts: int) -> int:
    """Rows per block from the mean slots per expert: small for decode (less padding), 64 for prefill."""
    return min(64, max(16, triton.next_power_of_2(-(-num_slots // num_experts))))


def _grouped_gemm(a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, sorted_slots: torch.Tensor,
                  block_experts: torch.Tensor, slots_per_row: int, weights: torch.Tensor | None,
                  block_m: int) -> None:
    """out[slot] = a[slot // slots_per_row] @ weight[expert].T (times weights[slot]) for every sorted slot."""
    n, k = weight.shape[1], weight.shape[2]
    dot_dtype, precision = dot_operands(weight)
    block_k = 32 if weight.element_size() == 4 else 64  # at most 48 KB of shared memory (triton_compile_check)
    grid = (block_experts.shape[0], triton.cdiv(n, _BLOCK_N))
    _grouped_gemm_kernel[grid](
        a, weight, out, sorted_slots, block_experts, weights, out.shape[0], weight.shape[0], n, k, a.stride(0),
        weight.stride(0), weight.stride(1), weight.stride(2), out.stride(0), SLOTS_PER_ROW=slots_per_row,
        APPLY_WEIGHT=weights is not None, BLOCK_M=block_m, BLOCK_N=_BLOCK_N, BLOCK_K=block_k,
        DOT_DTYPE=dot_dtype, PRECISION=precision, num_warps=4, num_stages=3)


def _check(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
           w2: torch.Tensor) -> None:
    tokens, hidden = hidden_states.shape
    experts, inter2 = w13.shape[0], w13.shape[1]
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != tokens:
        raise ValueError(f"fused_moe: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [{tokens}, top_k]")
    if inter2 % 2 or w13.shape[2] != hidden or w2.shape != (experts, hidden, inter2 // 2):
        raise ValueError(f"fused_moe: w13 {tuple(w13.shape)} must be [E, 2I, {hidden}] and w2 {tuple(w2.shape)} "
                         f"[E, {hidden}, I]")
    if w13.dtype != hidden_states.dtype or w2.dtype != hidden_states.dtype:
        raise ValueError(f"fused_moe: weights ({w13.dtype}, {w2.dtype}) must have the activations' dtype "
                         f"{hidden_states.dtype}")


def fused_moe(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
    _check(hidden_states, topk_weights, topk_ids, w13, w2)
    tokens, hidden = hidden_states.shape
    top_k, num_slots = topk_ids.shape[1], topk_ids.numel()
    if num_slots == 0:
        return torch.zeros_like(hidden_states)
    block_m = _block_m(num_slots, w13.shape[0])
    sorted_slots, block_experts = align_slots(topk_ids, w13.shape[0], block_m)
    gate_up = hidden_states.new_empty(num_slots, w13.shape[1])
    _grouped_gemm(rows_of(hidden_states), w13, gate_up, sorted_slots, block_experts, top_k, None, block_m)
    slot_out = hidden_states.new_empty(num_slots, hidden)
    activated = ops.silu_and_mul(gate_up) if swiglu_limit is None else clamped_silu_and_mul(gate_up, swiglu_limit)
    _grouped_gemm(activated, w2, slot_out, sorted_slots, block_experts, 1, topk_weights.flatten(),
                  block_m)
    out = hidden_states.new_empty(tokens, hidden)
    block = min(_SUM_BLOCK, triton.next_power_of_2(hidden))
    order = topk_ids.argsort(dim=1, stable=True)  # each token's choices in expert order
    _sum_kernel[(tokens, triton.cdiv(hidden, block))](slot_out, order, out, hidden, TOP_K=top_k, BLOCK=block,
                                                      num_warps=warps_for(block))
    return out


TRITON_MOE = CheckpointLayoutMoE(fused_moe)
