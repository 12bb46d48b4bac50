"""The transformers + PEFT reference the multi-LoRA tests compare served tokens against, and the random adapters
they serve (benchmarks/common/lora_adapters.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from peft import PeftModel

from benchmarks.common.lora_adapters import ATTENTION, MLP, VOCAB, random_adapter
from tests.hf_reference import hf_greedy, hf_model

__all__ = ["ATTENTION", "MLP", "VOCAB", "peft_greedy", "peft_model", "random_adapter"]


def peft_model(checkpoint: Path, adapter: Path | None) -> torch.nn.Module:
    """transformers + PEFT in fp32 (the base model alone when `adapter` is None)."""
    model = hf_model(checkpoint)
    return model if adapter is None else PeftModel.from_pretrained(model, adapter).eval()


def peft_greedy(checkpoint: Path, adapter: Path | None, prompts: Sequence[Sequence[int]],
                new_tokens: int) -> list[list[int]]:
    """transformers + PEFT greedy tokens in fp32."""
    return hf_greedy(peft_model(checkpoint, adapter), prompts, new_tokens)
