"""LoRA on the token embedding and the LM head, for a batch whose rows use different adapters.

PEFT adapts an embedding with `lora_embedding_A` [rank, vocab] and `lora_embedding_B` [hidden, rank]: a token's
delta is B·A[:, id], so A's column of the token replaces the shrink. The wrapper keeps A transposed per slot
([slots, vocab, max rank]), gathers each token's row, and hands the expand to the same "lora" op as the linears
with an identity A (exact: a product by one summed with zeros). The delta is added after the base's all-reduce,
so A and B are whole on every rank (rank-sized per token, no collective). The LM head is a linear from hidden to
vocabulary whose rows are split over ranks like a column-parallel layer: B keeps this rank's vocabulary rows and
the delta goes into the local logits before they are gathered. Logits are computed for a subset of the step's
tokens, so the head reads its rows' adapter slots through the step rows' logit selection (layers/step_rows.py).
Key design choice: both wrappers have LoRALinear's `targets` / `set_slot`, so AdapterSlots fills them alike.
Usage: `LoRAEmbedding(embedding, step, max_loras, max_rank, dtype, device)`; same for `LoRALMHead`.
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm import ops
from rapid_llm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from rapid_llm.lora.lora_linear import LoRAStep

Pairs = dict[str | int | None, tuple[torch.Tensor, torch.Tensor]]  # shard id (None) -> (A, B with the scaling)


def _zeros(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape, dtype=dtype, device=device), requires_grad=False)


class _VocabLoRA(nn.Module):
    """One whole matrix per adapter (the one "shard", None): (input, output) features = `sizes`."""

    lora_a: nn.Parameter
    lora_b: nn.Parameter

    def __init__(self, base: VocabParallelEmbedding, step: LoRAStep, sizes: tuple[int, int]) -> None:
        super().__init__()
        self.base = base
        self.step = step
        self.sizes = sizes

    def targets(self) -> dict[None, tuple[int, int]]:
        """None -> (input, output) features of the whole matrix an adapter's A and B must match."""
        return {None: self.sizes}

    def set_slot(self, slot: int, weights: Pairs) -> None:
        """Put one adapter in `slot`: None -> (A [rank, input], B [output, rank]); absent leaves zeros."""
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        pair = weights.get(None)
        if pair is not None:
            self._copy(slot, *pair)

    def _copy(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        raise NotImplementedError


class LoRAEmbedding(_VocabLoRA):
    def __init__(self, base: VocabParallelEmbedding, step: LoRAStep, max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(base, step, (base.vocab_size, base.hidden_size))
        self.lora_a = _zeros(max_loras, base.vocab_size, max_rank, dtype=dtype, device=device)  # A transposed
        self.lora_b = _zeros(max_loras, base.hidden_size, max_rank, dtype=dtype, device=device)
        self.register_buffer("identity", torch.eye(max_rank, dtype=dtype, device=device).repeat(max_loras, 1, 1))

    def _copy(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        self.lora_a[slot, :, : lora_a.shape[0]].copy_(lora_a.T)
        self.lora_b[slot, :, : lora_b.shape[1]].copy_(lora_b)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        output = self.base(input_ids)
        indices = self.step.indices()
        if indices is None:
            return output
        # A token without an adapter reads slot 0's row; the op leaves its output untouched.
        rows = self.lora_a[indices.token_slots.clamp(min=0), input_ids]
        ops.lora(rows, self.identity, self.lora_b, indices, output)
        return output


class LoRALMHead(_VocabLoRA):
    base: ParallelLMHead

    def __init__(self, base: ParallelLMHead, step: LoRAStep, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(base, step, (base.hidden_size, base.vocab_size))
        # This rank's vocabulary rows of B (its slice of the padded vocabulary; the padding rows stay zero).
        self.local_rows = max(0, min(base.rows_per_rank, base.vocab_size - base.vocab_start))
        self.lora_a = _zeros(max_loras, max_rank, base.hidden_size, dtype=dtype, device=device)
        self.lora_b = _zeros(max_loras, base.rows_per_rank, max_rank, dtype=dtype, device=device)

    def _copy(self, slot: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        rank = lora_a.shape[0]
        self.lora_a[slot, :rank].copy_(lora_a)
        self.lora_b[slot, : self.local_rows, :rank].copy_(lora_b.narrow(0, self.base.vocab_start, self.local_rows))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        indices = self.step.logit_indices()
        if indices is None:
            return self.base.compute_logits(hidden_states)
        local = self.base.kernel(hidden_states, self.base.weight)
        ops.lora(hidden_states, self.lora_a, self.lora_b, indices, local)
        return self.base.gather_logits(local)

VOCAB_WRAPPERS = {VocabParallelEmbedding: LoRAEmbedding, ParallelLMHead: LoRALMHead}  # exact classes
