"""Layered, frozen configuration resolved once in the launcher (ground floor: imports no engine code).

Exports resolve lazily so that a process needing only `SchedulerConfig` (the scheduler) never
imports torch or transformers.
"""

from __future__ import annotations

from rapid_llm.utils.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "rapid_llm.config.cache_config": ("CacheConfig",),
    "rapid_llm.config.compilation_config": ("CompilationConfig",),
    "rapid_llm.config.device_config": ("DeviceConfig",),
    "rapid_llm.config.engine_config": ("EngineConfig",),
    "rapid_llm.config.model_config": ("ModelConfig",),
    "rapid_llm.config.parallel_config": ("ParallelConfig",),
    "rapid_llm.config.scheduler_config": ("SchedulerConfig",),
})
