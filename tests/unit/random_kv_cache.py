"""A tiny model's paged KV cache filled with random bytes, for the tests that move blocks (transfer, offload tier)."""

from __future__ import annotations

import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.worker_proc.kv_cache import KVCache
from rapid_llm.worker_proc.model_runner import ModelRunner


def random_kv_cache(checkpoint, cache_dtype: str = "auto", block_size: int = 4) -> KVCache:
    config = ModelConfig.from_pretrained(str(checkpoint), max_model_len=32)
    runner = ModelRunner(config, CacheConfig(block_size=block_size, num_blocks=12, cache_dtype=cache_dtype),
                         DeviceConfig("cpu"), max_num_seqs=2)
    generator = torch.Generator().manual_seed(0)
    for layer in runner.kv_cache.layers:
        raw = layer.kv_cache.view(torch.uint8)
        raw.copy_(torch.randint(0, 120, raw.shape, dtype=torch.uint8, generator=generator))
    return runner.kv_cache
