"""Resumable training state in a work directory, and the standard HF folder exported from it.

The training state (float32 weights, AdamW moments, step, torch RNG state and the config it belongs
to) is one ``torch.save`` file, written to a temporary name and renamed, so a run killed mid-write
leaves the previous state intact. Exports are bfloat16 copies written by ``save_pretrained`` (as in
``rapid_llm.utils.tiny_checkpoint``), with the demo tokenizer next to them, so the folder is servable.

Usage:
    state = load_state(work_dir); save_state(work_dir, model, optimizer, step); export(model, out_dir)
"""

from __future__ import annotations

import copy
import os
import pathlib
import shutil
from typing import Any

import torch
import transformers

from tools.demo_model.tokenizer import ARTIFACT_DIR

STATE_NAME = "state.pt"


def save_state(work_dir: pathlib.Path, model: transformers.PreTrainedModel, optimizer: torch.optim.Optimizer,
               step: int) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    state = {
        "config": model.config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "rng": torch.get_rng_state(),
    }
    tmp = work_dir / (STATE_NAME + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, work_dir / STATE_NAME)


def load_state(work_dir: pathlib.Path, config: transformers.PretrainedConfig) -> dict[str, Any] | None:
    """The saved state, or None if there is none; raises if it was saved for another config."""
    path = work_dir / STATE_NAME
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    if _shape_fields(state["config"]) != _shape_fields(config.to_dict()):
        raise ValueError(f"{path} belongs to another model config; use a fresh --work-dir")
    return state


def _shape_fields(config: dict[str, Any]) -> dict[str, Any]:
    # Everything but bookkeeping that from_config/save_pretrained may fill in differently.
    return {key: value for key, value in config.items()
            if key not in {"transformers_version", "dtype", "torch_dtype", "_name_or_path"}}


def export(model: transformers.PreTrainedModel, out_dir: pathlib.Path,
           tokenizer_dir: pathlib.Path = ARTIFACT_DIR) -> pathlib.Path:
    """Save a bfloat16 copy of ``model`` plus the tokenizer files as an HF folder in ``out_dir``."""
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out_dir)
    for path in tokenizer_dir.iterdir():
        shutil.copyfile(path, out_dir / path.name)
    return out_dir
