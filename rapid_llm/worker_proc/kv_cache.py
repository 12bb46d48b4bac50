"""Allocate the paged KV cache and bind each attention layer to its slice.

Each layer gets one tensor [2, num_blocks, block_size, kv_heads, head_dim] (K then V). The
block count comes from an explicit number, else a byte budget: an explicit one, or on CUDA
the share of device memory left after the weights, or a fixed default on CPU.

The cache is allocated uninitialised (zero-filling gigabytes costs seconds of start-up on a
CPU) and a block is zeroed when it is freshly allocated to a request instead: attention reads a
block's unwritten tail under a mask, and masked garbage that happened to be NaN or inf would
still poison the softmax-weighted sum. Prefix-cache hits are never zeroed: they hold the KV being
reused. Block 0 is zeroed up front because block tables are padded with it. Once written, blocks
only ever hold finite K/V, which a mask handles.
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.config import CacheConfig, ModelConfig
from rapid_llm.config.cache_config import DEFAULT_CPU_KV_CACHE_BYTES
from rapid_llm.layers.attention import Attention
from rapid_llm.ops.attention import AttentionBackend


def attention_layers(model: nn.Module) -> list[Attention]:
    return [module for module in model.modules() if isinstance(module, Attention)]


def bytes_per_block(layers: list[Attention], block_size: int, dtype: torch.dtype) -> int:
    element_size = torch.empty((), dtype=dtype).element_size()
    return sum(2 * block_size * layer.num_kv_heads * layer.head_dim * element_size for layer in layers)


def kv_cache_budget(cache_config: CacheConfig, device: torch.device) -> int:
    if cache_config.kv_cache_memory_bytes is not None:
        return cache_config.kv_cache_memory_bytes
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # Activations are not profiled yet; the unused (1 - utilization) share is their headroom.
        # Capped by what is actually free, so memory other processes hold shrinks the cache
        # instead of failing the allocation.
        share = int(total * cache_config.gpu_memory_utilization) - torch.cuda.memory_allocated(device)
        return min(share, int(free * cache_config.gpu_memory_utilization))
    return DEFAULT_CPU_KV_CACHE_BYTES


def allocate_kv_cache(
    model: nn.Module, model_config: ModelConfig, cache_config: CacheConfig, backend: AttentionBackend,
    device: torch.device,
) -> int:
    """Allocate every layer's cache, bind the layers to it and the backend; return the block count."""
    layers = attention_layers(model)
    dtype = cache_config.kv_dtype(model_config.dtype)
    per_block = bytes_per_block(layers, cache_config.block_size, dtype)
    num_blocks = cache_config.num_blocks or kv_cache_budget(cache_config, device) // per_block
    if num_blocks < 1:
        raise ValueError(
            f"no room for a single KV block ({per_block} bytes) in the KV cache budget; "
            "raise --kv-cache-memory or --gpu-memory-utilization"
        )
    for layer in layers:
        layer.bind(
            torch.empty(2, num_blocks, cache_config.block_size, layer.num_kv_heads, layer.head_dim,
                        dtype=dtype, device=device),
            backend,
        )
    clear_blocks(layers, [0], device)
    return num_blocks


def clear_blocks(layers: list[Attention], block_ids: list[int], device: torch.device) -> None:
    """Zero blocks that were just freshly allocated to a request, in every layer."""
    index = torch.tensor(block_ids, dtype=torch.int64, device=device)
    for layer in layers:
        layer.kv_cache.index_fill_(1, index, 0)
