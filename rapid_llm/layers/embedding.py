"""Token embedding and LM head, sharded over tensor-parallel ranks along the vocabulary.

Each rank holds a contiguous slice of (padded) vocabulary rows. The embedding zeroes ids
outside its slice and all-reduces; the head computes its slice of logits and all-gathers.
With `tie_word_embeddings` the model points the head's weight at the embedding's. `prepare_weights`
then gives the head its own Parameter in the selected linear kernel's format: the same storage when
that format is the checkpoint's, else a copy (the embedding keeps the original; an untied head's
original is dropped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rapid_llm.distributed import get_tp_rank, get_tp_size, tp_all_gather, tp_all_reduce
from rapid_llm.layers.linear import LinearBase
from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.linear_kernel import TORCH_LINEAR


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.rows_per_rank = -(-vocab_size // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows_per_rank, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | int | None = None) -> None:
        if loaded.shape[0] != self.vocab_size:
            raise ValueError(f"checkpoint tensor has {loaded.shape[0]} vocabulary rows, the model {self.vocab_size}")
        rows = min(self.rows_per_rank, self.vocab_size - self.vocab_start)
        copy_weight(param.data[:rows], loaded[self.vocab_start : self.vocab_start + rows])
        param.data[rows:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local_ids = input_ids - self.vocab_start
        outside = (local_ids < 0) | (local_ids >= self.rows_per_rank)
        embedded = F.embedding(local_ids.masked_fill(outside, 0), self.weight)
        return tp_all_reduce(embedded.masked_fill(outside.unsqueeze(-1), 0))


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states to vocabulary logits (float32 is left to the sampler)."""

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(vocab_size, hidden_size)
        self.kernel = TORCH_LINEAR
        self.linear_method = None  # read by the borrowed prepare_weights: the LM head is never quantized

    prepare_weights = LinearBase.prepare_weights

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.gather_logits(self.kernel(hidden_states, self.weight))

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """Every rank's vocabulary slice of the logits side by side, the padding rows cut."""
        return tp_all_gather(local_logits, dim=-1)[..., : self.vocab_size]
