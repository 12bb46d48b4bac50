"""Model implementations, reached only through the lazy registry (this import loads no model file)."""

from rapid_llm.models.registry import resolve_model_class, supported_architectures

__all__ = ["resolve_model_class", "supported_architectures"]
