"""Allocate the paged KV cache from each paged layer's spec and bind every layer to its tensor and group backend.

Block ids are shared by every paged layer of every cache group (cache_groups.py); layers read them through KV
tables (`kv_tables.py`: sliding-window layers in tables of their own, which share tensors with the full-attention
tables). The block count is an explicit number, else a byte budget (explicit; on CUDA the share of device memory
left after the weights; a fixed default on CPU), less what the caller reserved (the state group's rows), divided by
what a block id costs over the distinct tensors. The cache is allocated uninitialised (zero-filling gigabytes costs
seconds of start-up on a CPU): a block is zeroed when freshly allocated to a request, since masked garbage that
happened to be NaN would still poison a softmax-weighted sum; prefix-cache hits never are, and block 0 is zeroed
up front (tables built on the host are padded with it). A worker-side proposer's layers (a draft model's cache
group) read table 0 and alone get scratch blocks past the shared ones (per slot, zeroed once). A quantized cache
(`--kv-cache-dtype fp8 | nvfp4`) is built for full attention only.
Usage: `cache = allocate_kv_cache(layers, tables, backends, model_config, cache_config, device, reserved_bytes)`.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import torch

from rapid_llm.config import CacheConfig, ModelConfig
from rapid_llm.config.cache_config import DEFAULT_CPU_KV_CACHE_BYTES
from rapid_llm.layers.attention import PagedAttentionLayer
from rapid_llm.ops.attention.kv_cache_spec import (FullAttentionSpec, KVCacheSpec, bytes_per_block,
                                                   num_blocks_for_budget)
from rapid_llm.ops.attention.kv_tables import KVTables
from rapid_llm.ops.attention.kv_quant import backend_reads_kv, is_fp8_kv, kv_format

logger = logging.getLogger(__name__)


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


@dataclass
class KVCache:
    """Every attention layer's paged tensor (bound to the layer), the spec it was allocated from, and the KV tables
    of the target's layers (the first `len(tables.table_of)` layers; a proposer's follow, reading table 0)."""

    layers: list[PagedAttentionLayer]
    specs: list[KVCacheSpec]
    num_blocks: int
    block_size: int  # tokens of a block this rank stores (a 1/N share with decode context parallelism)
    device: torch.device
    tables: KVTables
    extra_bytes: int = 0  # scratch blocks past num_blocks in a proposer's layers

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_bytes(self) -> int:
        return self.num_blocks * bytes_per_block([spec for _, spec in self._tensors()], self.block_size) + \
            self.extra_bytes

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Per KV table, the tokens its layers attend back at most (None: the whole context)."""
        return self.tables.windows

    def __post_init__(self) -> None:
        # One layer (and its spec) per distinct tensor, what zeroing and copying go over: tables share tensors.
        distinct: dict[int, tuple[PagedAttentionLayer, KVCacheSpec]] = {}
        for layer, spec in zip(self.layers, self.specs):
            distinct.setdefault(id(layer.kv_cache), (layer, spec))
        self._distinct = list(distinct.values())

    def _tensors(self) -> list[tuple[PagedAttentionLayer, KVCacheSpec]]:
        return self._distinct

    def clear_blocks(self, block_ids: list[int]) -> None:
        """Zero blocks that were just freshly allocated to a request, in every tensor."""
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        for layer, spec in self._tensors():
            spec.zero_blocks(layer.kv_cache, index)

    def clear_extra_blocks(self) -> None:
        """Zero the blocks past num_blocks that a proposer's layers have (its scratch), once: unwritten tails are read
        under a mask, which garbage NaN would still poison."""
        for layer, spec in self._tensors():
            total = layer.kv_cache.shape[spec.block_dim]
            if total > self.num_blocks:
                spec.zero_blocks(layer.kv_cache, torch.arange(self.num_blocks, total, device=self.device))

    def copy_blocks(self, src_ids: list[int], dst_ids: list[int]) -> None:
        """Copy blocks src_ids[i] -> dst_ids[i] in every layer, scales and all (beam search's copy-on-write).

        The sources are read before any destination is written, so a block may be both."""
        src = torch.tensor(src_ids, dtype=torch.int64, device=self.device)
        dst = torch.tensor(dst_ids, dtype=torch.int64, device=self.device)
        for layer, spec in self._tensors():
            # CPU torch has no float8 index_copy_: move the bytes.
            cache = layer.kv_cache.view(torch.uint8) if is_fp8_kv(layer.kv_cache.dtype) else layer.kv_cache
            cache.index_copy_(spec.block_dim, dst, cache.index_select(spec.block_dim, src))


    @property
    def num_tensors(self) -> int:
        """The distinct paged tensors, what `read_blocks` and `write_blocks` go over one at a time."""
        return len(self._distinct)

    def layout_id(self, tp_size: int = 1) -> str:
        """What two caches must share for one's blocks to be written into the other's as bytes: each distinct
        tensor's spec, dtype and page shape without the block count, and the block size; with `tp_size`, those of
        one rank's share of this cache in a tensor-parallel group of that size (its slice of the KV heads)."""
        parts = []
        for layer, spec in self._distinct:
            shape = _page_shape_of_one_block(layer.kv_cache, spec)
            if tp_size > 1 and isinstance(spec, FullAttentionSpec):
                count = head_slice(spec.num_kv_heads, 0, tp_size)[1]
                spec, shape = replace(spec, num_kv_heads=count), (*shape[:_HEAD_DIM], count, *shape[_HEAD_DIM + 1:])
            parts.append(f"{spec!r}|{layer.kv_cache.dtype}|{shape}")
        return hashlib.sha256("\n".join([str(self.block_size), *parts]).encode()).hexdigest()[:16]

    def read_blocks(self, tensor: int, block_ids: Sequence[int], tp_rank: int = 0, tp_size: int = 1) -> torch.Tensor:
        """Distinct tensor `tensor`'s blocks `block_ids`, in that order, as contiguous uint8 bytes on the CPU; with
        `tp_size`, only the KV heads rank `tp_rank` of that tensor-parallel size holds (a latent cache whole)."""
        layer, spec = self._distinct[tensor]
        index = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        # Bytes throughout: CPU torch has no float8 index ops, and a byte copy is exact for every dtype.
        blocks = layer.kv_cache.view(torch.uint8).index_select(spec.block_dim, index)
        if tp_size > 1 and isinstance(spec, FullAttentionSpec):
            start, count = head_slice(spec.num_kv_heads, tp_rank, tp_size)
            blocks = blocks.narrow(_HEAD_DIM, start, count)
        return blocks.contiguous().cpu()

    def read_block_rows(self, tensor: int, block_ids: Sequence[int]) -> torch.Tensor:
        """`read_blocks` with one row of bytes per block: [len(block_ids), bytes of one block] (the offload tier)."""
        block_dim = self._distinct[tensor][1].block_dim
        return self.read_blocks(tensor, block_ids).movedim(block_dim, 0).reshape(len(block_ids), -1)

    def write_block_rows(self, tensor: int, block_ids: Sequence[int], rows: torch.Tensor) -> None:
        """The rows `read_block_rows` gave into blocks `block_ids` of `tensor`."""
        layer, spec = self._distinct[tensor]
        page = list(layer.kv_cache.view(torch.uint8).shape)
        del page[spec.block_dim]
        blocks = rows.reshape(len(block_ids), *page).movedim(0, spec.block_dim)
        self.write_blocks(tensor, block_ids, blocks.contiguous().view(-1))

    def memory_regions(self) -> list[tuple[int, int]]:
        """(address, bytes) of each distinct tensor: what a transfer engine registers."""
        return [(layer.kv_cache.data_ptr(), layer.kv_cache.nbytes) for layer, _ in self._distinct]

    def block_segments(self, tensor: int, block_ids: Sequence[int]) -> list[tuple[int, int]]:
        """Where blocks `block_ids` of distinct tensor `tensor` lie in memory: (address, bytes) pairs, block by
        block, one per index before the tensor's block dimension (K and V apart, for full attention)."""
        layer, spec = self._distinct[tensor]
        cache = layer.kv_cache
        if not cache.is_contiguous():
            raise ValueError(f"KV tensor {tensor} is not contiguous: its blocks have no byte segments")
        inner = math.prod(cache.shape[spec.block_dim + 1:]) * cache.element_size()
        outer, stride = math.prod(cache.shape[:spec.block_dim]), cache.shape[spec.block_dim] * inner
        base = cache.data_ptr()
        return [(base + index * stride + block * inner, inner) for block in block_ids for index in range(outer)]

    def write_blocks(self, tensor: int, block_ids: Sequence[int], data: torch.Tensor) -> None:
        """The bytes `read_blocks` gave (of a cache with this layout_id) into blocks `block_ids` of `tensor`."""
        layer, spec = self._distinct[tensor]
        cache = layer.kv_cache.view(torch.uint8)
        shape = list(cache.shape)
        shape[spec.block_dim] = len(block_ids)
        if data.dtype != torch.uint8 or data.numel() != math.prod(shape):
            raise ValueError(f"KV tensor {tensor}: {data.numel()} bytes for {len(block_ids)} blocks, expected "
                             f"{math.prod(shape)} (a cache of another layout?)")
        index = torch.tensor(list(block_ids), dtype=torch.int64, device=self.device)
        cache.index_copy_(spec.block_dim, index, data.to(self.device).view(shape))


# The KV-head dimension of a full-attention page (FullAttentionSpec.page_shape: [2, blocks, block_size, heads, row]).
_HEAD_DIM = 3


def head_slice(num_heads: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    """(first, count) of the KV heads tensor-parallel rank `tp_rank` of `tp_size` holds, as the QKV projection
    splits them (layers/linear.py: a slice each, or whole heads replicated when there are fewer heads than ranks)."""
    count = max(1, num_heads // tp_size)
    return (tp_rank // max(1, tp_size // num_heads)) * count, count


def _page_shape_of_one_block(cache: torch.Tensor, spec: KVCacheSpec) -> tuple[int, ...]:
    shape = list(cache.shape)
    shape[spec.block_dim] = 1
    return tuple(shape)


def check_kv_dtype(layers: list[PagedAttentionLayer], specs: list[KVCacheSpec], dtype: torch.dtype,
                   backends: Mapping[str, Any]) -> None:
    """Refuse a quantized cache where it is not built; say when checkpoint KV scales go unused."""
    fmt = kv_format(dtype)
    if fmt is not None:
        other = sorted({type(spec).__name__ for spec in specs if not isinstance(spec, FullAttentionSpec)})
        if other:
            raise ValueError(f"--kv-cache-dtype {fmt} is built for full attention only, not for this model's {other} "
                             "caches (MLA / DeepSeek-V4 latent caches); use --kv-cache-dtype auto")
        if not all(backend_reads_kv(backends[layer.attention_op], dtype) for layer in layers):
            raise ValueError(f"the selected attention backend does not read an {fmt} KV cache; use "
                             "--attention-backend torch_ref or --kv-cache-dtype auto")
    if fmt != "fp8" and any(getattr(layer, "kv_scales_from_checkpoint", False) for layer in layers):
        logger.info("the checkpoint's k_scale/v_scale are loaded and unused: the KV cache is %s, not fp8",
                    fmt or dtype)


def allocate_kv_cache(
    layers: list[PagedAttentionLayer], tables: KVTables, backends: Mapping[str, Any], model_config: ModelConfig,
    cache_config: CacheConfig, device: torch.device, reserved_bytes: int = 0, scratch_blocks: Sequence[int] = (),
) -> KVCache:
    """Allocate the paged tensors from the layers' specs and bind every layer to its tensor and its op's backend.
    The first layers were split into the KV `tables` (shared tensors); the rest (a proposer's) get a tensor each
    and, per layer, `scratch_blocks[i]` blocks past the shared ones. A memory budget pays for `reserved_bytes` (the
    state group's rows) and the scratch first."""
    num_tabled = len(tables.table_of)
    dtype = cache_config.kv_dtype(model_config.dtype)
    specs = [layer.kv_cache_spec(dtype) for layer in layers]
    check_kv_dtype(layers, specs, dtype, backends)
    scratch = [*scratch_blocks] or [0] * len(layers)
    tensor_of = [*tables.tensor_of, *range(tables.num_tensors, tables.num_tensors + len(layers) - num_tabled)]
    tensor_specs = {tensor: spec for tensor, spec in zip(tensor_of, specs)}
    tensor_scratch = {tensor: blocks for tensor, blocks in zip(tensor_of, scratch)}
    # A rank's share of each block's tokens: all of them, or 1/N with decode context parallelism.
    block_size = cache_config.rank_block_size
    extra_bytes = sum(tensor_scratch[tensor] * spec.bytes_per_block(block_size)
                      for tensor, spec in tensor_specs.items())
    page_bytes = bytes_per_block(list(tensor_specs.values()), block_size)
    num_blocks = cache_config.num_blocks or num_blocks_for_budget(
        list(tensor_specs.values()), block_size, kv_cache_budget(cache_config, device) - reserved_bytes - extra_bytes)
    if num_blocks < 1:
        reserved = f" after {reserved_bytes} bytes of recurrent state" if reserved_bytes else ""
        raise ValueError(f"no room for a single KV block ({page_bytes} bytes) in the KV cache budget{reserved}; "
                         "raise --kv-cache-memory or --gpu-memory-utilization")
    tensors = {tensor: spec.allocate(num_blocks + tensor_scratch[tensor], block_size, device)
               for tensor, spec in tensor_specs.items()}
    for layer, tensor in zip(layers, tensor_of):
        layer.bind(tensors[tensor], backends[layer.attention_op])
    cache = KVCache(layers, specs, num_blocks, block_size, device, tables, extra_bytes)
    cache.clear_blocks([0])
    cache.clear_extra_blocks()
    return cache
