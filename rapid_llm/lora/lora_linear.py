"""LoRALinear: a linear layer plus each token's LoRA adapter, for a batch whose rows use different adapters.

y = base(x) + B_s·A_s·x for the adapter slot s of each token (none: base(x) alone). The wrapper holds, per slice of
the base's output (q/k/v of a merged QKV, gate/up, or the whole output), A [slots, max rank, in] and B [slots, rows,
max rank] on the device, zero-padded to the max rank (exact: the padding adds zeros) with the adapter's scaling
folded into B. Tensor parallelism shards B like the base weight (`output_slice`) and, for a row-parallel layer, A
over its input columns: each rank adds its partial B·A·x before the base's all-reduce, which sums them to the whole
product, so LoRA adds no collective. Which slot each token uses comes from the step's rows (layers/step_rows.py)
through `LoRAStep`, which builds the grouped indices once per step for every layer ("lora" op, ops/multi_lora.py).
Usage: `wrapper = LoRALinear(linear, step, max_loras, max_rank)`; `wrapper.set_slot(slot, {"q": (A, B)})`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from rapid_llm import ops
from rapid_llm.layers.linear import (ColumnParallelLinear, LinearBase, MergedColumnParallelLinear,
                                     QKVParallelLinear, RowParallelLinear)
from rapid_llm.layers.step_rows import StepRows
from rapid_llm.ops.multi_lora import LoRAIndices, lora_indices

# Exactly these classes: a subclass may be read directly by its model (DeepSeek's kv_b_proj weight) or have a
# checkpoint layout of its own (chunked in_proj), which an adapter's B could not follow.
LORA_LINEARS = (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear)
SLOT_COLUMN = "lora_slot"  # the step-rows column: each token's adapter slot, -1 for the base model


class LoRAStep:
    """The current step's adapter indices, shared by every LoRALinear; built once per step, on first use."""

    def __init__(self, rows: StepRows, num_slots: int) -> None:
        self.rows = rows
        self.num_slots = num_slots
        self.active = False  # whether any running request has an adapter (set by the slots' owner)
        self._token_slots: torch.Tensor | None = None
        self._indices: LoRAIndices | None = None

    def indices(self) -> LoRAIndices | None:
        """None when no running request has an adapter (the layers then run the base alone)."""
        if not self.active:
            return None
        token_slots = self.rows.values(SLOT_COLUMN)
        if token_slots is not self._token_slots:  # the rows gather a new tensor each step
            self._token_slots, self._indices = token_slots, lora_indices(token_slots, self.num_slots)
        return self._indices


class LoRASlice(NamedTuple):
    shard_id: str | int | None  # the base's shard id (e.g. "q", 0), None for a single matrix
    start: int  # first column of this rank's output the slice adds to
    rows: int  # this rank's output columns of the slice
    source: int  # first row of the adapter's whole B this rank holds


class LoRALinear(nn.Module):
    def __init__(self, base: LinearBase, step: LoRAStep, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.step = step
        self.row_parallel = isinstance(base, RowParallelLinear)
        self.slices = [LoRASlice(shard, *base.output_slice(shard)) for shard in base.shard_ids()]
        self.lora_a = nn.ParameterList(
            nn.Parameter(torch.zeros(max_loras, max_rank, base.input_size, dtype=dtype, device=device),
                         requires_grad=False) for _ in self.slices)
        self.lora_b = nn.ParameterList(
            nn.Parameter(torch.zeros(max_loras, piece.rows, max_rank, dtype=dtype, device=device), requires_grad=False)
            for piece in self.slices)

    def targets(self) -> dict[str | int | None, tuple[int, int]]:
        """Shard id -> (input, output) features of the whole checkpoint matrix an adapter's A and B must match."""
        return {piece.shard_id: self.base.checkpoint_shape(piece.shard_id)[::-1] for piece in self.slices}

    def set_slot(self, slot: int, weights: dict[str | int | None, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one adapter in `slot`: shard id -> (A [rank, in], B [out, rank] with the scaling folded in), whole
        checkpoint matrices; slices it leaves out get zeros."""
        for a_slots, b_slots, piece in zip(self.lora_a, self.lora_b, self.slices):
            a_slots[slot].zero_()
            b_slots[slot].zero_()
            pair = weights.get(piece.shard_id)
            if pair is None:
                continue
            lora_a, lora_b = pair
            rank = lora_a.shape[0]
            if self.row_parallel:
                lora_a = lora_a.narrow(1, *self.base.input_slice())
            a_slots[slot, :rank].copy_(lora_a)
            b_slots[slot, :, :rank].copy_(lora_b.narrow(0, piece.source, piece.rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = self.step.indices()
        if indices is None:
            return self.base(x)
        if self.row_parallel:
            output = self.base.kernel(x, self.base.weight)
            self._add(x, output, indices)
            return self.base.combine(output)
        output = self.base(x)
        self._add(x, output, indices)
        return output

    def _add(self, x: torch.Tensor, output: torch.Tensor, indices: LoRAIndices) -> None:
        for a_slots, b_slots, piece in zip(self.lora_a, self.lora_b, self.slices):
            ops.lora(x, a_slots, b_slots, indices, output[:, piece.start:piece.start + piece.rows])
