"""The one lazy loader: a "module:attribute" target is imported only when it is needed.

Registries (ops, models, speculative proposers, quantization methods) and the process launcher name what
they build as such strings, so importing a registry imports none of its entries: the launcher and the
scheduler stay torch-free, a broken optional entry cannot break the others, and a low floor of the package
can name code on a higher one without importing it (docs/architecture.md, "Floors").
Usage: `cls = import_target("rapid_llm.models.llama:LlamaForCausalLM")`.
"""

from __future__ import annotations

import importlib
from typing import Any


def is_target(text: object) -> bool:
    """Whether `text` has a target's shape: a string "module:attribute", both parts non-empty."""
    if not isinstance(text, str):
        return False
    module, colon, attribute = text.partition(":")
    return bool(colon and module and attribute)


def import_target(target: str) -> Any:
    """The attribute `target` ("module:attribute") names, importing its module."""
    if not is_target(target):
        raise ValueError(f"{target!r} is not a 'module:attribute' target")
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
