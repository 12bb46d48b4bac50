"""Layered, frozen configuration resolved once in the launcher (ground floor: imports no engine code).

Exports resolve lazily so that a process needing only `SchedulerConfig` (the scheduler) never
imports torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CacheConfig": "rapid_llm.config.cache_config",
    "DeviceConfig": "rapid_llm.config.device_config",
    "EngineConfig": "rapid_llm.config.engine_config",
    "ModelConfig": "rapid_llm.config.model_config",
    "SchedulerConfig": "rapid_llm.config.scheduler_config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rapid_llm.config' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
