"""Attention backends, chosen by name; the pure-torch reference works everywhere."""

from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout
from rapid_llm.ops.attention.torch_ref import TorchReferenceBackend

_BACKENDS: dict[str, type[AttentionBackend]] = {TorchReferenceBackend.name: TorchReferenceBackend}


def select_attention_backend(name: str = "auto") -> AttentionBackend:
    """`auto` is the torch reference backend, the only one built so far."""
    if name == "auto":
        name = TorchReferenceBackend.name
    if name not in _BACKENDS:
        raise ValueError(f"--attention-backend {name!r} is unknown; choose one of {sorted(_BACKENDS)} or 'auto'")
    return _BACKENDS[name]()


__all__ = ["AttentionBackend", "AttentionMetadata", "StepLayout", "select_attention_backend"]
