"""Build a model from the registry and fill it straight from safetensors."""

from rapid_llm.model_loader.loader import load_model

__all__ = ["load_model"]
