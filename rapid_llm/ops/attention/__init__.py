"""Attention backends, registered as implementations of the "attention" and "mla_attention" ops (`ops/catalog.py`).

Exports resolve lazily, so importing the package (the launcher does, through the op catalog) does not
import torch.
"""

from __future__ import annotations

from rapid_llm.utils.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "rapid_llm.ops.attention.backend": ("AttentionBackend", "AttentionMetadata", "StepLayout"),
    "rapid_llm.ops.attention.mla_backend": ("MLABackend", "MLADims"),
})
