"""EngineConfig: every resolved setting of one engine launch, built once and handed to each process."""

from __future__ import annotations

from dataclasses import dataclass

from rapid_llm.config.cache_config import CacheConfig
from rapid_llm.config.device_config import DeviceConfig
from rapid_llm.config.model_config import ModelConfig
from rapid_llm.config.scheduler_config import SchedulerConfig


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    device: DeviceConfig
    scheduler: SchedulerConfig
    tokenizer: str
    served_model_name: str
    attention_backend: str = "auto"
    log_level: str = "info"
