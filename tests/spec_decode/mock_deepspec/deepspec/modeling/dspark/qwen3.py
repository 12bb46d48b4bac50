"""Stand-in `Qwen3DSparkModel`: the attributes the adapter reads (`target_layer_ids`, `block_size`,
`mask_token_id`, `dtype`), its own embedding and head (as DSpark's, copied from the target), a confidence head
whose step logits are fixed (`confidence_logit`), and `from_pretrained(path, dtype=)`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig


class Qwen3DSparkModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        self.target_layer_ids = config.target_layer_ids
        self.block_size = int(config.block_size)
        self.mask_token_id = config.mask_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @classmethod
    def from_pretrained(cls, path, *args, dtype=None, **kwargs):
        model = cls(PretrainedConfig(**json.loads((Path(path) / "config.json").read_text())))
        return model.to(dtype) if dtype is not None else model

    def confidence_logits(self, length: int) -> torch.Tensor:
        return torch.full((1, length), float(self.config.confidence_logit))
