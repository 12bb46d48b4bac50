"""Write a quantized model as a standard GPTQ / AWQ checkpoint: config.json with `quantization_config`, one
model.safetensors, and the source's tokenizer and generation files copied unchanged.

Every tensor of the model's state dict is written in the source dtype (AWQ's folded norm weights included),
except the quantized linear layers, whose `weight` is replaced by their packed tensors (int32 words, fp16
scales). A tied LM head is not written (the loader ties it again).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

SKIPPED_SOURCE_FILES = ("config.json", "model.safetensors.index.json")


def write_checkpoint(model: nn.Module, tensors: dict[str, dict[str, torch.Tensor]], source: Path, out: Path,
                     dtype: torch.dtype, quantization_config: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.removesuffix(".weight") in tensors and name.endswith(".weight"):
            continue
        state[name] = tensor.detach().to(dtype).contiguous().clone()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    for module, packed in tensors.items():
        state.update({f"{module}.{key}": value.contiguous() for key, value in packed.items()})
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and path.name not in SKIPPED_SOURCE_FILES:
            shutil.copyfile(path, out / path.name)
