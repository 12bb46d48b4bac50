"""DFlash adapter (z-lab's `dflash` 0.1.0, docs/spec_decode/dflash.md): a block-diffusion drafter in the worker.

The library's draft model (`DFlashDraftModel`, or `DFlash2DraftModel` with its candidate selector) reads the
target's hidden states of its `target_layer_ids` and the embedding of [anchor, mask x (block - 1)] (the
target's own embedding table, times the checkpoint's `input_embedding_scale`) and drafts the block in one
forward through the target's output head. Per-slot context bookkeeping is `block_drafter.py`'s. Without the
library, or with another version, building the proposer raises; nothing falls back to another method.

Usage: --speculative-config '{"method": "dflash", "model": "<DFlash checkpoint>", "num_speculative_tokens": 7}'
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rapid_llm.spec_decode.block_drafter import BlockDrafter, crop_cache, import_library
from rapid_llm.spec_decode.model_proposer import TargetContext

SUPPORTED_VERSIONS = ("0.1.0",)
INSTALL = "pip install 'dflash[local]==0.1.0'"


class DFlashProposer(BlockDrafter):
    method = "dflash"

    def __init__(self, config, target: TargetContext) -> None:
        super().__init__(config, target)
        library = import_library(self.method, "dflash", "dflash", SUPPORTED_VERSIONS, INSTALL)
        if config.model is None:
            raise ValueError("--speculative-config: method 'dflash' needs \"model\": the DFlash checkpoint directory")
        architectures = json.loads((Path(config.model) / "config.json").read_text()).get("architectures") or []
        cls = library.DFlash2DraftModel if "DFlash2DraftModel" in architectures else library.DFlashDraftModel
        self.model = cls.from_pretrained(config.model, dtype=target.model_config.dtype).to(target.device).eval()
        self.selector = cls is library.DFlash2DraftModel
        self.hidden_state_layers = tuple(int(layer) for layer in self.model.target_layer_ids)
        self.block_size = int(self.model.block_size)
        self.mask_token_id = int(self.model.mask_token_id)
        self.embedding_scale = float((getattr(self.model.config, "dflash_config", None) or {})
                                     .get("input_embedding_scale", 1.0))
        self.check_block()

    def new_cache(self) -> object:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def _output_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.model.compute_logits(hidden.reshape(-1, hidden.shape[-1])).view(*hidden.shape[:-1], -1)

    def draft(self, cache: object, features: torch.Tensor, anchor_token: int, anchor_position: int,
              limit: int) -> list[int]:
        device = self.target.device
        block = torch.full((1, self.block_size), self.mask_token_id, dtype=torch.int64, device=device)
        block[0, 0] = anchor_token
        noise = self.target.model.model.embed_tokens(block.view(-1)).view(1, self.block_size, -1)
        context = features.shape[0]
        positions = torch.arange(anchor_position - context, anchor_position + self.block_size, device=device)
        hidden = self.model(target_hidden=features.unsqueeze(0).to(noise.dtype),
                            noise_embedding=noise * self.embedding_scale, position_ids=positions.unsqueeze(0),
                            past_key_values=cache, use_cache=True)
        hidden = hidden[:, 1 - self.block_size :, :]  # the positions after the anchor
        crop_cache(cache, anchor_position)
        if self.selector:
            tokens = self.model.propose(hidden, block[:, 0], self._output_head, 0.0)[0]
        else:
            tokens = self.model.compute_logits(hidden, self._output_head).argmax(dim=-1)
        return tokens[0, :limit].tolist()
