"""Per-layer cache specs: what one layer stores, and so its tensors' shapes.

Paged layers declare a `KVCacheSpec` (`kv_cache_spec(dtype)`): full attention keeps K and V per KV head
([2, blocks, block_size, kv_heads, head_dim]; fp8 or nvfp4 storage with `kv_quant.py`), MLA one latent per
token ([blocks, block_size, kv_lora_rank + qk_rope_head_dim]), DeepSeek-V4 one row per token holding its K=V and
its compressors' inputs and entries (`DeepseekV4Spec`). All paged layers share block ids, so one block costs the
sum of its tensors' bytes for it (`kv_tables.py`: tables of windowed and full layers share tensors), and a byte
budget buys blocks by that sum. A recurrent layer (Gated DeltaNet, Mamba) declares a `StateSpec` instead:
fixed-size state per request, one row per input-batch slot, whatever the context length. The layouts here are the contract between the worker that allocates and the
backends and layers that read them.
Usage: `num_blocks_for_budget(specs, block_size, budget)`; `spec.allocate(num_blocks, block_size, device)`;
`state_spec.allocate(num_slots, device)`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

from rapid_llm.ops.attention.kv_quant import KVScales, is_fp8_kv, is_nvfp4_kv, nvfp4_row_bytes


@dataclass(frozen=True)
class KVCacheSpec(ABC):
    dtype: torch.dtype
    block_dim: ClassVar[int]  # the dimension of the paged tensor that indexes blocks

    @property
    @abstractmethod
    def elements_per_token(self) -> int:
        """Cache elements one token takes in this layer."""

    @abstractmethod
    def page_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """Shape of this layer's paged tensor."""

    def bytes_per_block(self, block_size: int) -> int:
        return block_size * self.elements_per_token * torch.empty((), dtype=self.dtype).element_size()

    def allocate(self, num_blocks: int, block_size: int, device: torch.device) -> torch.Tensor:
        # Uninitialised on purpose: blocks are zeroed when they are handed to a request.
        return torch.empty(self.page_shape(num_blocks, block_size), dtype=self.dtype, device=device)

    def zero_blocks(self, cache: torch.Tensor, block_ids: torch.Tensor) -> None:
        # float8 has no index_fill_ on CPU; its zero bytes are +0.0.
        target = cache.view(torch.uint8) if is_fp8_kv(cache.dtype) else cache
        target.index_fill_(self.block_dim, block_ids, 0)


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    """K and V per KV head. Blocks behind a window go back to the pool (`kv_tables.py`)."""

    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    kv_scales: KVScales = KVScales()  # dequantization scales, used when the cache is fp8
    block_dim: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if is_nvfp4_kv(self.dtype):
            nvfp4_row_bytes(self.head_dim)  # refuses a head_dim off the 16-element groups, at start-up

    @property
    def row_width(self) -> int:
        """Cache elements per token and KV head: head_dim, or an nvfp4 row's bytes (codes, then group scales)."""
        return nvfp4_row_bytes(self.head_dim) if is_nvfp4_kv(self.dtype) else self.head_dim

    @property
    def elements_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.row_width

    def page_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (2, num_blocks, block_size, self.num_kv_heads, self.row_width)


@dataclass(frozen=True)
class MLALatentSpec(KVCacheSpec):
    """One latent per token: kv_a_layernorm(compressed kv) then the rotated rope key, shared by all heads."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    block_dim: ClassVar[int] = 0

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def elements_per_token(self) -> int:
        return self.latent_dim

    def page_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.latent_dim)


@dataclass(frozen=True)
class DeepseekV4Spec(KVCacheSpec):
    """One DeepSeek-V4 row per token: the shared K=V (`head_dim`), then per compressor (the attention's, then
    the Lightning Indexer's; none on sliding layers) its compressed entry (written only on the last token of
    a window of `rate` tokens) and the token's raw projected kv and gate ((2 if overlapping else 1) * width
    each), which windows closing in later steps read back. Paged like every layer, so prefix-cache blocks
    carry everything a continuation needs."""

    head_dim: int
    compressor_widths: tuple[int, ...] = ()
    rate: int = 0
    overlap: bool = False  # CSA: two series per token, windows of 2 * rate overlapping by `rate`
    block_dim: ClassVar[int] = 0

    @property
    def series(self) -> int:
        return 2 if self.overlap else 1

    def compressor_offsets(self, index: int) -> tuple[int, int, int]:
        """Column offsets (entry, raw kv, raw gate) of compressor `index` in a row."""
        offset = self.head_dim
        for width in self.compressor_widths[:index]:
            offset += width * (1 + 2 * self.series)
        width = self.compressor_widths[index]
        return offset, offset + width, offset + width * (1 + self.series)

    @property
    def elements_per_token(self) -> int:
        return self.head_dim + sum(width * (1 + 2 * self.series) for width in self.compressor_widths)

    def page_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        return (num_blocks, block_size, self.elements_per_token)


@dataclass(frozen=True)
class StateSpec:
    """A recurrent layer's per-request state: one tensor [slots, *shape] per entry of `shapes` (Mamba keeps a conv
    and an SSM state, a linear-attention layer one matrix), a row per input-batch slot. Not paged: its size does not
    grow with the context, so it is sized once for every slot before the paged layers get the rest of the budget."""

    dtype: torch.dtype
    shapes: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.shapes or any(not shape or min(shape) < 1 for shape in self.shapes):
            raise ValueError(f"a state spec needs at least one state shape of positive sizes, got {self.shapes}")

    def bytes_per_slot(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return element * sum(math.prod(shape) for shape in self.shapes)

    def allocate(self, num_slots: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        # Zeroed (a few rows, unlike the KV cache): a row is reset again whenever a sequence starts at token 0.
        return tuple(torch.zeros((num_slots, *shape), dtype=self.dtype, device=device) for shape in self.shapes)


def bytes_per_block(specs: Sequence[KVCacheSpec], block_size: int) -> int:
    """What one block id costs across the tensors of `specs` (each holds its own page for it)."""
    return sum(spec.bytes_per_block(block_size) for spec in specs)


def num_blocks_for_budget(specs: Sequence[KVCacheSpec], block_size: int, budget_bytes: int) -> int:
    per_block = bytes_per_block(specs, block_size)
    if per_block < 1:
        raise ValueError("a model without attention layers has no KV cache to size")
    return budget_bytes // per_block
