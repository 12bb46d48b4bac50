"""Stand-in for z-lab's `dflash` 0.1.0, with the API rapid_llm's adapter calls (docs/spec_decode/dflash.md):
`DFlashDraftModel` / `DFlash2DraftModel` (`from_pretrained(path, dtype=)`, `target_layer_ids`, `block_size`,
`mask_token_id`, `config.dflash_config`, `forward(position_ids, attention_mask, noise_embedding, target_hidden,
past_key_values, use_cache)`, `compute_logits(hidden, output_head)`, DFlash2's `propose(hidden, anchor_ids,
output_head, temperature)`), `extract_context_feature` and `sample`, with the same signatures. It checks what the
real model relies on: target_hidden is [1, n, layers x hidden], the position ids run on from the cache's length
over the n context rows and the block, and it writes the cache through `DynamicCache.update` as attention does.
Its hidden state is the block's embedding plus the mean context row, so drafts depend on both. Every call is
kept in CALLS."""

from __future__ import annotations

import json
from pathlib import Path
import torch
from torch import nn
from transformers import PretrainedConfig

__version__ = "0.1.0"
CALLS: list[dict] = []


def extract_context_feature(hidden_states: list[torch.Tensor], layer_ids: list[int] | None) -> torch.Tensor:
    return torch.cat([hidden_states[layer_id + 1] for layer_id in layer_ids], dim=-1)


def sample(logits: torch.Tensor, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1).view(-1, logits.shape[-1]), 1).view(
        logits.shape[:-1])


class DFlashDraftModel(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        self.target_layer_ids = config.dflash_config.get("target_layer_ids")
        self.block_size = int(config.dflash_config.get("block_size", 16))
        self.mask_token_id = config.dflash_config.get("mask_token_id")
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        with torch.no_grad():
            self.fc.weight.zero_()
            for index in range(len(self.target_layer_ids)):
                self.fc.weight[:, index * config.hidden_size : (index + 1) * config.hidden_size] += torch.eye(
                    config.hidden_size) / len(self.target_layer_ids)

    @classmethod
    def from_pretrained(cls, path, *args, dtype=None, **kwargs):
        fields = json.loads((Path(path) / "config.json").read_text())
        model = cls(PretrainedConfig(**fields))
        return model.to(dtype) if dtype is not None else model

    def forward(self, position_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                noise_embedding: torch.Tensor | None = None, target_hidden: torch.Tensor | None = None,
                past_key_values=None, use_cache: bool = False, **kwargs) -> torch.Tensor:
        batch, context, width = target_hidden.shape
        block = noise_embedding.shape[1]
        if batch != 1 or width != len(self.target_layer_ids) * self.config.hidden_size:
            raise ValueError(f"target_hidden must be [1, n, {len(self.target_layer_ids)} x hidden], got "
                             f"{tuple(target_hidden.shape)}")
        cached = past_key_values.get_seq_length()
        expected = torch.arange(cached, cached + context + block, device=position_ids.device)
        if not torch.equal(position_ids[0], expected):
            raise ValueError(f"position ids {position_ids[0].tolist()} do not continue the cache ({cached} tokens)")
        projected = self.fc(target_hidden)
        keys = torch.cat([projected, noise_embedding], dim=1)[:, None, :, :1]
        past_key_values.update(keys, keys, 0)
        CALLS.append({"target_hidden": target_hidden.detach().clone(), "positions": position_ids[0].tolist(),
                      "cached": cached})
        context_mean = past_key_values.layers[0].keys.mean() if context else 0.0
        return noise_embedding + projected.mean(dim=1, keepdim=True) + context_mean

    def compute_logits(self, hidden, output_head):
        return output_head(hidden) * float(self.config.dflash_config.get("output_multiplier", 1.0))


class DFlash2DraftModel(DFlashDraftModel):
    def propose(self, hidden, anchor_ids, output_head, temperature):
        logits = self.compute_logits(hidden, output_head)
        candidates = torch.topk(logits, 4, dim=-1).indices
        return candidates[..., 0], candidates, None
