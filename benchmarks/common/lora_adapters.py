"""Random PEFT LoRA adapters for a checkpoint, saved as `PeftModel.save_pretrained` saves them.

A and B are both drawn at random (PEFT's `init_lora_weights=False`; its default zero B would change nothing) and
B is scaled by `weight_scale`, so an adapter visibly moves greedy tokens. An embedding's A and B (PEFT draws them
from a unit normal) are scaled down to the size of the random checkpoint's embeddings instead. The tests compare served tokens with
PEFT's own forward of these folders; benchmarks/bench_lora.sh serves many of them.
Usage: `random_adapter(checkpoint_dir, out_dir, rank=8, target_modules=["q_proj", "v_proj"], seed=0)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import transformers
from peft import LoraConfig, get_peft_model

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
VOCAB = ["embed_tokens", "lm_head"]
EMBEDDING_SCALE = 0.1


def random_adapter(checkpoint: Path, out_dir: Path, rank: int, target_modules: Sequence[str], seed: int,
                   use_rslora: bool = False, weight_scale: float = 4.0) -> Path:
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), init_lora_weights=False,
                        use_rslora=use_rslora)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_embedding_" in name:
                parameter.mul_(EMBEDDING_SCALE)
            elif "lora_B" in name:
                parameter.mul_(weight_scale)
    peft_model.save_pretrained(out_dir)
    return out_dir
