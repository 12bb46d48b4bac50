"""Attention backends, chosen by name (`registry.py`); the pure-torch reference works everywhere.

Exports resolve lazily, so `rapid_llm.ops.attention.registry` can check a backend name in the
launcher without importing torch.
"""

from __future__ import annotations

from rapid_llm.utils.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "rapid_llm.ops.attention.backend": ("AttentionBackend", "AttentionMetadata", "StepLayout"),
    "rapid_llm.ops.attention.registry": ("select_attention_backend",),
})
