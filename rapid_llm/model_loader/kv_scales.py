"""Checkpoint KV-cache scales (`k_scale` / `v_scale`) and the attention layer each one belongs to.

The names vLLM reads: `<layer>.self_attn.k_scale`, `<layer>.self_attn.attn.k_scale` and, as compressed-tensors
and Quark write them, `<layer>.self_attn.k_proj.output_scale` (same for v). Each is one per-tensor value (a
per-head vector is refused: per-tensor is the granularity built). The loader hands these names here instead
of to the strict parameter match; they are always read and set on the layer, and used only when the KV cache
is fp8 (`worker_proc/kv_cache.py` logs when they are loaded and unused).
"""

from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

from rapid_llm.layers.attention import Attention

_KV_SCALE_NAME = re.compile(r"(?P<module>.+)\.(?:attn\.)?(?:(?P<which>[kv])_scale|(?P<proj>[kv])_proj\.output_scale)")


def kv_scale_target(name: str) -> tuple[str, str] | None:
    """(module path that holds the attention layer, "k" or "v") for a KV-scale checkpoint name, else None."""
    match = _KV_SCALE_NAME.fullmatch(name)
    if match is None:
        return None
    return match["module"], match["which"] or match["proj"]


def set_kv_scales(model: nn.Module, scales: dict[str, torch.Tensor]) -> None:
    """Put each checkpoint scale (name -> tensor) on the one `Attention` layer under its module."""
    modules = dict(model.named_modules())
    for name, tensor in scales.items():
        path, which = kv_scale_target(name)
        layers = [m for m in modules.get(path, nn.Module()).modules() if isinstance(m, Attention)]
        if len(layers) != 1:
            raise ValueError(f"checkpoint tensor {name!r}: no single attention layer under {path!r} to take it")
        if tensor.numel() != 1:
            raise ValueError(f"checkpoint tensor {name!r}: a per-tensor KV scale has one element, got shape "
                             f"{tuple(tensor.shape)}")
        layer = layers[0]
        value = float(tensor.float())
        layer.kv_scales = dataclasses.replace(layer.kv_scales, **{f"{which}_scale": value})
        layer.kv_scales_from_checkpoint = True
