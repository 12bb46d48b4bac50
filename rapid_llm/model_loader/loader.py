"""load_model: construct the registered class on the target device and dtype, then load weights.

Parameters are created directly on the device in the model dtype, and each checkpoint tensor
is copied into its parameter once (the copy casts). Every parameter must be filled exactly
by the checkpoint: missing or unexpected tensors are an error naming them, except those the model
declares in `skipped_checkpoint_keys` or a module marks `checkpoint_elsewhere` (another process loads them), which
are never read and summarised in one log line per load.
A quantized model's linear layers get their quantization's parameters between building and loading
(rapid_llm/quantization/apply.py); KV-cache scales (`k_scale`/`v_scale`) go to their attention layers
(`kv_scales.py`). Then every layer with a `prepare_weights` hook puts its weights in the format of the
kernel it selects.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from rapid_llm.config import ModelConfig
from rapid_llm.layers.weight_utils import default_weight_loader
from rapid_llm.model_loader.kv_scales import kv_scale_target, set_kv_scales
from rapid_llm.model_loader.safetensors_files import iterate_tensors
from rapid_llm.models.weight_mapping import (
    IGNORED_CHECKPOINT_SUFFIXES,
    SkippedKeys,
    checkpoint_name_of,
    expected_shards,
    map_checkpoint_name,
    skipped_by,
)
from rapid_llm.models import resolve_model_class
from rapid_llm.quantization.apply import quantize_model

logger = logging.getLogger(__name__)
# How many skipped names the log line shows per declaration.
SHOWN_NAMES = 3


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Floating-point tensors created inside default to `dtype` (the model dtype) unless they name another."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _log_skipped(model: nn.Module, skipped: dict[SkippedKeys, list[str]]) -> None:
    parts = []
    for entry, names in skipped.items():
        shown = ", ".join(names[:SHOWN_NAMES]) + (", ..." if len(names) > SHOWN_NAMES else "")
        parts.append(f"{len(names)} tensors {entry.keys} ({shown}): {entry.reason}")
    logger.info("%s skips checkpoint tensors it does not load: %s", type(model).__name__, "; ".join(parts))


def _elsewhere(model: nn.Module) -> tuple[SkippedKeys, ...]:
    """One declaration per reason for the modules whose weights another process loads (`checkpoint_elsewhere`)."""
    by_reason: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        reason = getattr(module, "checkpoint_elsewhere", None)
        if reason:
            by_reason.setdefault(reason, []).append(name)
    return tuple(SkippedKeys(f"{names[0]}.* and the like", "(" + "|".join(map(re.escape, names)) + r")\..+", reason)
                 for reason, names in by_reason.items())


def load_weights(model: nn.Module, model_dir: Path) -> None:
    stacked = getattr(model, "stacked_params", ())
    declared = (*getattr(model, "skipped_checkpoint_keys", ()), *_elsewhere(model))
    params = dict(model.named_parameters())
    tied_lm_head = getattr(model.config, "tie_word_embeddings", False)
    loaded: dict[str, set[str | int | None]] = {name: set() for name in params}
    unexpected: list[str] = []
    skipped: dict[SkippedKeys, list[str]] = {}
    kv_scales: dict[str, torch.Tensor] = {}

    def wanted(name: str) -> bool:
        entry = skipped_by(name, declared)
        if entry is not None:
            skipped.setdefault(entry, []).append(name)
        return entry is None

    for name, tensor in iterate_tensors(model_dir, wanted):
        if name.endswith(IGNORED_CHECKPOINT_SUFFIXES) or (tied_lm_head and name == "lm_head.weight"):
            continue
        if kv_scale_target(name) is not None:
            kv_scales[name] = tensor
            continue
        param_name, shard_id = map_checkpoint_name(name, stacked)
        param = params.get(param_name)
        if param is None:
            unexpected.append(name)
            continue
        try:
            getattr(param, "weight_loader", default_weight_loader)(param, tensor, shard_id)
        except (ValueError, RuntimeError) as error:
            raise ValueError(f"checkpoint tensor {name!r}: {error}") from error
        loaded[param_name].add(shard_id)
    set_kv_scales(model, kv_scales)
    if skipped:
        _log_skipped(model, skipped)
    if unexpected:
        raise ValueError(f"checkpoint in {model_dir} has weights the model does not use: {', '.join(unexpected)}")
    missing = [
        checkpoint_name_of(name, shard_id, stacked)
        for name in params
        for shard_id in sorted(expected_shards(name, stacked) - loaded[name], key=str)
    ]
    if missing:
        raise ValueError(f"checkpoint in {model_dir} lacks weights the model needs: {', '.join(missing)}")


def load_model(model_config: ModelConfig, device: torch.device) -> nn.Module:
    """Build the checkpoint's architecture on `device` in the model dtype and load its weights."""
    model_class = resolve_model_class(model_config.architecture)
    with torch.device(device), default_dtype(model_config.dtype):
        model = model_class(model_config.hf_config)
        if model_config.quantization is not None:
            quantize_model(model, model_config.quantization)
    load_weights(model, Path(model_config.model))
    for module in model.modules():
        if hasattr(module, "prepare_weights"):
            module.prepare_weights()
    return model.eval()
