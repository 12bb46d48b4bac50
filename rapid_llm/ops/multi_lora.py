"""The `lora` op: batched multi-LoRA, each token's low-rank delta added in place into a projection's output.

out[t] += (x[t] @ lora_a[s].T) @ lora_b[s].T for every token t whose adapter slot s = token_slots[t] is not -1: a
"shrink" to the rank, then an "expand". lora_a [L, R, in] and lora_b [L, out, R] hold the L device slots (ranks
below R zero-padded, the scaling folded into B by the caller); `out` may be a strided column slice of a merged
projection's output (q of qkv) and is written through its strides. Products are summed in fp32 and added to out
with one rounding; rows without an adapter keep their values bit for bit. `lora_indices` groups the step's tokens
by slot once (a stable sort, no host sync), and every LoRA layer of the step shares the result. torch_ref gathers each
token's A and B (the oracle); `lora_grouped` runs two GEMMs per present slot, slicing instead of gathering a slot
whose tokens are one run (a prefill); rapid_llm/ops/triton/lora.py walks the same groups on CUDA.
Usage: `indices = lora_indices(token_slots, num_slots)`; per layer `REGISTRY.op("lora")(x, lora_a, lora_b,
indices, out)`, which returns None.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class LoRAIndices(NamedTuple):
    """A step's tokens grouped by adapter slot, built once per step; device tensors only."""

    token_slots: torch.Tensor  # [T] int64: each token's adapter slot, -1 = no adapter
    sorted_tokens: torch.Tensor  # [T] int64: token indices by slot, ascending within one, no-adapter tokens last
    slot_starts: torch.Tensor  # [L + 1] int64: slot s has sorted_tokens[slot_starts[s]:slot_starts[s + 1]]


def lora_indices(token_slots: torch.Tensor, num_slots: int) -> LoRAIndices:
    """Group the tokens of `token_slots` [T] (slots in [-1, num_slots)) by slot. Slot values are checked on CPU
    only: on CUDA that would read them back to the host."""
    if token_slots.dim() != 1 or token_slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lora_indices: token_slots must be a 1-D int32/int64 tensor, got "
                         f"{tuple(token_slots.shape)} {token_slots.dtype}")
    if num_slots < 1:
        raise ValueError(f"lora_indices: num_slots must be at least 1, got {num_slots}")
    slots = token_slots.long()
    if slots.device.type == "cpu" and slots.numel():
        lowest, highest = int(slots.min()), int(slots.max())
        if lowest < -1 or highest >= num_slots:
            raise ValueError(f"lora_indices: token_slots must lie in [-1, {num_slots}), got {lowest} to {highest}")
    keys = torch.where(slots < 0, num_slots, slots)  # no adapter sorts after every slot
    sorted_keys, sorted_tokens = keys.sort(stable=True)
    slot_starts = torch.searchsorted(sorted_keys, torch.arange(num_slots + 1, device=slots.device))
    return LoRAIndices(slots, sorted_tokens, slot_starts)


def check_lora_args(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
                    out: torch.Tensor) -> None:
    """Shapes and dtypes only (no value is read, so no host sync); every implementation calls it."""
    if x.dim() != 2 or lora_a.dim() != 3 or lora_b.dim() != 3:
        raise ValueError(f"lora: x {tuple(x.shape)} must be [T, in], lora_a {tuple(lora_a.shape)} [L, R, in] and "
                         f"lora_b {tuple(lora_b.shape)} [L, out, R]")
    num_slots, rank, in_features = lora_a.shape
    num_tokens, out_features = x.shape[0], lora_b.shape[1]
    if (x.shape[1] != in_features or lora_b.shape != (num_slots, out_features, rank)
            or out.shape != (num_tokens, out_features)):
        raise ValueError(f"lora: x {tuple(x.shape)}, lora_a {tuple(lora_a.shape)}, lora_b {tuple(lora_b.shape)} and "
                         f"out {tuple(out.shape)} must be [T, in], [L, R, in], [L, out, R] and [T, out]")
    if indices.token_slots.shape != (num_tokens,) or indices.slot_starts.shape != (num_slots + 1,):
        raise ValueError(f"lora: indices cover {indices.token_slots.shape[0]} tokens and "
                         f"{indices.slot_starts.shape[0] - 1} slots; the call has {num_tokens} and {num_slots} "
                         "(build them with lora_indices(token_slots, num_slots) for this step)")
    if not x.dtype == lora_a.dtype == lora_b.dtype == out.dtype:
        raise ValueError(f"lora: x, lora_a, lora_b and out must share one dtype, got {x.dtype}, {lora_a.dtype}, "
                         f"{lora_b.dtype} and {out.dtype}")


def lora(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
         out: torch.Tensor) -> None:
    """The reference: every token's A and B gathered (slot -1 reads slot 0, then is masked out), two batched
    products in fp32. Costs T * R * (in + out) gathered elements, so it is the oracle, not a prefill path."""
    check_lora_args(x, lora_a, lora_b, indices, out)
    slots = indices.token_slots
    gathered = slots.clamp(min=0)
    shrunk = torch.einsum("tri,ti->tr", lora_a[gathered].float(), x.float())
    delta = torch.einsum("tor,tr->to", lora_b[gathered].float(), shrunk)
    out.copy_(torch.where((slots >= 0).unsqueeze(1), out + delta, out))


def _delta(rows: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
    """(rows @ lora_a.T) @ lora_b.T in fp32, for rows [n, in] of one slot."""
    return rows.float() @ lora_a.float().T @ lora_b.float().T


def lora_grouped(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
                 out: torch.Tensor) -> None:
    """Two GEMMs per slot that has tokens; reads the slot offsets back to the host, so it is the CPU path."""
    check_lora_args(x, lora_a, lora_b, indices, out)
    starts = indices.slot_starts.tolist()
    for slot, (begin, end) in enumerate(zip(starts, starts[1:])):
        if begin == end:
            continue
        tokens = indices.sorted_tokens[begin:end]
        first, last = int(tokens[0]), int(tokens[-1])
        if last - first == end - begin - 1:  # ascending and as many as the range: one run, so a view
            # add_ of an fp32 tensor rounds once into out's dtype.
            out[first:last + 1].add_(_delta(x[first:last + 1], lora_a[slot], lora_b[slot]))
        else:
            rows = out.index_select(0, tokens).add_(_delta(x.index_select(0, tokens), lora_a[slot], lora_b[slot]))
            out.index_copy_(0, tokens, rows)
