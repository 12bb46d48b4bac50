"""CacheConfig: how the paged KV cache is laid out and how much memory it may take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rapid_llm.config.dtypes import dtype_from_name, dtype_name

if TYPE_CHECKING:
    import torch

DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # what vLLM's CPU backend reserves by default
# Quantized KV caches (ops/attention/kv_quant.py), vLLM's spellings; "fp8" is e4m3.
FP8_KV_CACHE_DTYPES = ("fp8", "fp8_e4m3")
NVFP4_KV_CACHE_DTYPE = "nvfp4"  # e2m1 codes with fp8 scales per 16 values (kv_quant.py)
# The cache tensor's torch dtype for each quantized cache, by attribute name (this module stays torch-free;
# kv_quant.py takes its dtypes from here): fp8 bytes, or NVFP4's packed codes and scales as uint8.
KV_CACHE_STORAGE = {**dict.fromkeys(FP8_KV_CACHE_DTYPES, "float8_e4m3fn"), NVFP4_KV_CACHE_DTYPE: "uint8"}
NOT_BUILT_KV_CACHE_DTYPES = ("fp8_e5m2",)


@dataclass(frozen=True)
class CacheConfig:
    """block_size tokens per KV block; the pool is sized by `num_blocks` if given, else by
    `kv_cache_memory_bytes`, else (CUDA) `gpu_memory_utilization` of the device or (CPU) 4 GiB.
    `state_snapshots`: rows of recurrent state kept at block boundaries for prefix-cache hits of models with state
    layers (paid from the budget before the blocks; 0: such models get no hits). `offload_bytes` (None: none) sizes
    the prefix cache's second tier, kept in host memory or, with `offload_path`, in a file in that directory."""

    block_size: int = 16
    cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    state_snapshots: int = 0
    offload_bytes: int | None = None
    offload_path: str | None = None
    # Decode context parallelism: each rank stores 1/N of every block's tokens (`block_size` is the whole block's).
    context_parallel_size: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.block_size <= 1024 * self.context_parallel_size:
            raise ValueError(f"--block-size must be in [1, 1024], got {self.block_size}")
        if self.block_size % self.context_parallel_size:
            raise ValueError(f"a KV block of {self.block_size} tokens does not split over "
                             f"{self.context_parallel_size} decode-context-parallel ranks")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"--kv-cache-memory must be positive, got {self.kv_cache_memory_bytes} bytes")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be at least 1, got {self.num_blocks}")
        if self.state_snapshots < 0:
            raise ValueError(f"--max-state-snapshots must be at least 0, got {self.state_snapshots}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.cache_dtype in NOT_BUILT_KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype {self.cache_dtype} is not built yet; use auto, "
                             f"{' or '.join(FP8_KV_CACHE_DTYPES)} (e4m3), {NVFP4_KV_CACHE_DTYPE} or a float dtype")
        if self.cache_dtype not in ("auto", NVFP4_KV_CACHE_DTYPE, *FP8_KV_CACHE_DTYPES):
            dtype_name(self.cache_dtype, "--kv-cache-dtype")

    def kv_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        if self.cache_dtype in KV_CACHE_STORAGE:
            import torch

            return getattr(torch, KV_CACHE_STORAGE[self.cache_dtype])
        return model_dtype if self.cache_dtype == "auto" else dtype_from_name(self.cache_dtype, "--kv-cache-dtype")

    @property
    def rank_block_size(self) -> int:
        """Tokens of a block one rank stores (the whole block without decode context parallelism)."""
        return self.block_size // self.context_parallel_size
