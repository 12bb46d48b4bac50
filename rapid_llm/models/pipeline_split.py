"""A decoder stack split into pipeline stages: the layers, embedding and head a stage holds, and the checkpoint
tensors it leaves to the other stages.

A stage builds only its own decoder layers; the others are `StageElsewhere` placeholders (no parameters), so
module names keep their checkpoint indices and the loader skips the other stages' tensors by name
(`skipped_keys`). The first stage embeds the tokens; the last normalises and computes logits (with tied
embeddings it keeps the embedding too: its head reads that weight). Between stages the hidden states and the
residual travel as one [2, tokens, hidden] tensor (the model runner sends and receives it).
Usage: `split = StageSplit.of(config)`; `split.holds(i)`, `split.skipped_keys(prefix)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.distributed.pipeline import pipeline_stage
from rapid_llm.models.weight_mapping import SkippedKeys

REASON = "held by another pipeline stage"


class StageElsewhere(nn.Module):
    """Stands for a module another pipeline stage holds; calling it is a bug."""

    def forward(self, *args: object) -> None:
        raise RuntimeError("this module is held by another pipeline stage")


@dataclass(frozen=True)
class StageSplit:
    layers: range  # the decoder layers this stage holds
    is_first: bool
    is_last: bool
    tied_embeddings: bool

    @classmethod
    def of(cls, config: PretrainedConfig) -> StageSplit:
        stage = pipeline_stage()
        return cls(stage.layers(config.num_hidden_layers), stage.is_first, stage.is_last,
                   bool(getattr(config, "tie_word_embeddings", False)))

    @property
    def whole(self) -> bool:
        return self.is_first and self.is_last

    @property
    def embeds(self) -> bool:
        return self.is_first or (self.is_last and self.tied_embeddings)

    def holds(self, layer_id: int) -> bool:
        return layer_id in self.layers

    def skipped_keys(self, num_layers: int) -> tuple[SkippedKeys, ...]:
        """The Llama family's checkpoint tensors this stage does not load."""
        if self.whole:
            return ()
        others = "|".join(str(i) for i in range(num_layers) if i not in self.layers)
        keys = [SkippedKeys("model.layers.N.* of other stages", rf"model\.layers\.({others})\..+", REASON)]
        if not self.embeds:
            keys.append(SkippedKeys("model.embed_tokens.*", r"model\.embed_tokens\..+", REASON))
        if not self.is_last:
            keys.append(SkippedKeys("model.norm.*, lm_head.*", r"(model\.norm|lm_head)\..+", REASON))
        return tuple(keys)

    @staticmethod
    def pack(hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """What a stage hands the next: [2, tokens, hidden]."""
        return torch.stack((hidden_states, residual))
