"""Layered, frozen configuration resolved once in the launcher (ground floor: imports no engine code)."""

from rapid_llm.config.cache_config import CacheConfig
from rapid_llm.config.device_config import DeviceConfig
from rapid_llm.config.model_config import ModelConfig

__all__ = ["CacheConfig", "DeviceConfig", "ModelConfig"]
