"""The transformers + PEFT reference the multi-LoRA tests compare served tokens against, and the random adapters
they serve (benchmarks/common/lora_adapters.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from peft import PeftModel

from benchmarks.common.lora_adapters import ATTENTION, MLP, random_adapter
from tests.hf_reference import hf_greedy, hf_model

__all__ = ["ATTENTION", "MLP", "peft_greedy", "random_adapter"]


def peft_greedy(checkpoint: Path, adapter: Path | None, prompts: Sequence[Sequence[int]],
                new_tokens: int) -> list[list[int]]:
    """transformers + PEFT greedy tokens in fp32 (the base model alone when `adapter` is None)."""
    model = hf_model(checkpoint)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).eval()
    return hf_greedy(model, prompts, new_tokens)
