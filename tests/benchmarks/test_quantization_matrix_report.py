"""The quantization matrix's memory arithmetic equals what the engine holds: for online modes of the demo
model, `expected_weight_bytes` is the bytes of the ModelRunner's parameters after quantization (what
/server_info reports as weight_bytes), and `expected_kv_tokens` the KV cache's token capacity."""

from __future__ import annotations

import pytest

from benchmarks.quantization_matrix_report import expected_kv_tokens, expected_weight_bytes
from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.utils.demo_checkpoint import demo_model_dir
from rapid_llm.worker_proc.model_runner import ModelRunner

CACHE_BYTES = 8 * 2**20


@pytest.mark.parametrize("row", ["bf16", "fp8", "fp8-block32", "w4a16", "mxfp4", "nvfp4"])
def test_weight_bytes_match_the_engine(row: str) -> None:
    model = demo_model_dir("demo-target")
    config = ModelConfig.from_pretrained(str(model), quantization=None if row == "bf16" else row)
    runner = ModelRunner(config, CacheConfig(block_size=16, num_blocks=4), DeviceConfig("cpu"))
    assert runner.weight_bytes == expected_weight_bytes(model, row)


@pytest.mark.parametrize("kv", ["auto", "fp8", "nvfp4"])
def test_kv_tokens_match_the_engine(kv: str) -> None:
    model = demo_model_dir("demo-target")
    config = ModelConfig.from_pretrained(str(model))
    cache = CacheConfig(block_size=16, cache_dtype=kv, kv_cache_memory_bytes=CACHE_BYTES)
    runner = ModelRunner(config, cache, DeviceConfig("cpu"))
    assert runner.num_tokens == expected_kv_tokens(model, kv, CACHE_BYTES)
