"""DSpark adapter (DeepSeek's DeepSpec 0.1.0, docs/spec_decode/dspark.md): DFlash backbone + Markov head +
confidence head, in the worker.

DeepSpec ships no inference package: its evaluation code is the published interface. This adapter calls the
same entry points its evaluator does -- `forward_dspark_draft_block` (the block forward over the context
features and [anchor, mask x (block - 1)], the draft's own embedding) and `build_dspark_proposal` (the Markov
head's sequential pick inside the block, and the confidence head, which cuts the proposal where the predicted
prefix acceptance falls below `confidence_threshold`) -- on the checkpoint's `Qwen3DSparkModel` or
`Gemma4DSparkModel`. Per-slot context bookkeeping is `block_drafter.py`'s. Without DeepSpec, or with another
version, building the proposer raises.

Usage: --speculative-config '{"method": "dspark", "model": "<DSpark checkpoint>", "num_speculative_tokens": 6,
                              "confidence_threshold": 0.5}'
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch

from rapid_llm.spec_decode.block_drafter import BlockDrafter, crop_cache, import_library
from rapid_llm.spec_decode.model_proposer import TargetContext
from rapid_llm.utils.lazy_import import import_target

SUPPORTED_VERSIONS = ("0.1.0",)
INSTALL = "pip install the DeepSpec repository (github.com/deepseek-ai/DeepSpec, version 0.1.0)"
_MODELS = {"Qwen3DSparkModel": "deepspec.modeling.dspark.qwen3", "Gemma4DSparkModel": "deepspec.modeling.dspark.gemma4"}


class DSparkProposer(BlockDrafter):
    method = "dspark"

    def __init__(self, config, target: TargetContext) -> None:
        super().__init__(config, target)
        import_library(self.method, "deepspec", "deepspec", SUPPORTED_VERSIONS, INSTALL)
        if config.model is None:
            raise ValueError("--speculative-config: method 'dspark' needs \"model\": the DSpark checkpoint directory")
        architectures = json.loads((Path(config.model) / "config.json").read_text()).get("architectures") or []
        known = [name for name in architectures if name in _MODELS]
        if not known:
            raise ValueError(f"--speculative-config: {config.model} is not a DSpark checkpoint (architectures "
                             f"{architectures}; known: {', '.join(_MODELS)})")
        cls = import_target(f"{_MODELS[known[0]]}:{known[0]}")
        self.ops = importlib.import_module("deepspec.eval.dspark.draft_ops")
        self.model = cls.from_pretrained(config.model, dtype=target.model_config.dtype).to(target.device).eval()
        layers = [int(layer) for layer in self.model.target_layer_ids]
        num_layers = len(target.model.model.layers)
        if -1 in layers or num_layers - 1 in layers:
            raise ValueError(f"--speculative-config: the DSpark checkpoint reads target layers {layers}; the embedding "
                             f"output (-1) and the final layer ({num_layers - 1}) are not exported to proposers")
        self.hidden_state_layers = tuple(layers)
        self.block_size = int(self.model.block_size)
        self.mask_token_id = int(self.model.mask_token_id)
        self.check_block()

    def new_cache(self) -> object:
        from transformers import DynamicCache

        return DynamicCache()

    def draft(self, cache: object, features: torch.Tensor, anchor_token: int, anchor_position: int,
              limit: int) -> list[int]:
        device = self.target.device
        block = torch.full((1, self.block_size), self.mask_token_id, dtype=torch.int64, device=device)
        block[0, 0] = anchor_token
        positions = torch.arange(anchor_position + self.block_size, device=device).unsqueeze(0)
        hidden = self.ops.forward_dspark_draft_block(
            self.model, draft_input_ids=block, position_ids=positions, past_key_values_draft=cache,
            target_hidden_states=features.unsqueeze(0).to(self.model.dtype), start=anchor_position,
            block_size=self.block_size)
        crop_cache(cache, anchor_position)  # as dflash's reference loop does; a no-op if the library cropped
        proposal = self.ops.build_dspark_proposal(model=self.model, draft_input_ids=block, block_hidden=hidden,
                                                  block_size=self.block_size, temperature=0.0,
                                                  confidence_threshold=self.config.confidence_threshold)
        count = min(int(proposal.draft_token_count), limit)
        return proposal.verify_input_ids[0, 1 : 1 + count].tolist()
