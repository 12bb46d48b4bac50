"""The transformers reference every correctness test compares against: greedy generate, one prompt at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import transformers

TRANSFORMERS_VERSION = tuple(int(part) for part in transformers.__version__.split(".")[:2])
TOKENIZER_IMPORTS_TORCH = TRANSFORMERS_VERSION < (5, 18)
TOKENIZER_IMPORTS_TORCH_REASON = ("transformers < 5.18 imports torch with PreTrainedTokenizerFast (its tokenizer "
                                  "module imports modeling_gguf_pytorch_utils at the top), so the HTTP process does")


def bf16_reference_fault(architecture: str) -> str | None:
    """Why this transformers' own bfloat16 forward of `architecture` cannot be a reference, or None."""
    if architecture == "DeepseekV4ForCausalLM" and TRANSFORMERS_VERSION < (5, 20):
        return ("transformers < 5.20's DeepSeek-V4 RMSNorm returns float32 inside a bfloat16 model, so its own "
                "bfloat16 forward fails (expected m1 and m2 to have the same dtype)")
    return None


def hf_model(checkpoint: Path | str, dtype: torch.dtype = torch.float32) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()


def hf_greedy(model: transformers.PreTrainedModel, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    """Exactly `new_tokens` greedy tokens per prompt (EOS masked until then, like our min_tokens)."""
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            input_ids = torch.tensor([list(prompt)], device=model.device)
            generated = model.generate(input_ids, do_sample=False, max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, pad_token_id=0)
            outputs.append(generated[0, len(prompt):].tolist())
    return outputs


def hf_logits(model: transformers.PreTrainedModel, token_ids: Sequence[int]) -> torch.Tensor:
    """float32 logits at every position of one sequence, on the model's device."""
    with torch.inference_mode():
        return model(torch.tensor([list(token_ids)], device=model.device)).logits[0].float()
