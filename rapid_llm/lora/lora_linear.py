"""LoRALinear: a linear layer plus each token's LoRA adapter, for a batch whose rows use different adapters.

y = base(x) + B_s·A_s·x for the adapter slot s of each token (none: base(x) alone). The wrapper holds one A [slots,
pieces x max rank, in] and one B [slots, out, pieces x max rank] on the device, where a piece is a slice of the
base's output (q/k/v of a merged QKV, gate/up, or the whole output): piece i's A rows and B columns are the i-th
block of max-rank width, and its B rows are its own output columns, so B is block-diagonal and one "lora" op call
adds every piece's delta (the zero blocks add exact zeros). Ranks are zero-padded to the max rank (exact) and the
adapter's scaling is folded into B. Tensor parallelism shards B like the base weight (`output_slice`) and, for a
row-parallel layer, A over its input columns: each rank adds its partial B·A·x before the base's all-reduce,
which sums them to the whole product, so LoRA adds no collective. Which slot each token uses comes from the step's
rows (layers/step_rows.py) through `LoRAStep`, which builds the grouped indices once per step for every layer
("lora" op, ops/multi_lora.py).
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

    def logit_indices(self) -> LoRAIndices | None:
        """Like `indices`, for the rows of the logits being computed (the LM head's tokens)."""
        if not self.active:
            return None
        return lora_indices(self.rows.logit_values(SLOT_COLUMN), self.num_slots)


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
        self.max_rank = max_rank
        width = len(self.slices) * max_rank
        self.lora_a = nn.Parameter(torch.zeros(max_loras, width, base.input_size, dtype=dtype, device=device),
                                   requires_grad=False)
        self.lora_b = nn.Parameter(torch.zeros(max_loras, base.output_size, width, dtype=dtype, device=device),
                                   requires_grad=False)

    def targets(self) -> dict[str | int | None, tuple[int, int]]:
        """Shard id -> (input, output) features of the whole checkpoint matrix an adapter's A and B must match."""
        return {piece.shard_id: self.base.checkpoint_shape(piece.shard_id)[::-1] for piece in self.slices}

    def set_slot(self, slot: int, weights: dict[str | int | None, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put one adapter in `slot`: shard id -> (A [rank, in], B [out, rank] with the scaling folded in), whole
        checkpoint matrices; slices it leaves out get zeros."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        for index, piece in enumerate(self.slices):
            pair = weights.get(piece.shard_id)
            if pair is None:
                continue
            lora_a, lora_b = pair
            first, rank = index * self.max_rank, lora_a.shape[0]
            if self.row_parallel:
                lora_a = lora_a.narrow(1, *self.base.input_slice())
            self.lora_a[slot, first:first + rank].copy_(lora_a)
            self.lora_b[slot, piece.start:piece.start + piece.rows, first:first + rank].copy_(
                lora_b.narrow(0, piece.source, piece.rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = self.step.indices()
        if indices is None:
            return self.base(x)
        if self.row_parallel:
            output = self.base.kernel(x, self.base.weight)
            ops.lora(x, self.lora_a, self.lora_b, indices, output)
            return self.base.combine(output)
        output = self.base(x)
        ops.lora(x, self.lora_a, self.lora_b, indices, output)
        return output
