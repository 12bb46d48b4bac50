"""Attention backends by name: "name" -> "module:Class", imported only when one is selected.

The launcher checks --attention-backend here without importing torch; the worker selects one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid_llm.ops.attention.backend import AttentionBackend

_BACKENDS: dict[str, str] = {"torch": "rapid_llm.ops.attention.torch_ref:TorchReferenceBackend"}
DEFAULT_BACKEND = "torch"  # what `auto` means: the torch reference, the only backend built so far


def check_attention_backend(name: str = "auto") -> str:
    """The backend `name` selects (`auto` resolved); raise ValueError, listing the known ones, if none."""
    if name == "auto":
        return DEFAULT_BACKEND
    if name not in _BACKENDS:
        raise ValueError(f"--attention-backend {name!r} is unknown; choose one of {sorted(_BACKENDS)} or 'auto'")
    return name


def select_attention_backend(name: str = "auto") -> AttentionBackend:
    module_name, class_name = _BACKENDS[check_attention_backend(name)].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
