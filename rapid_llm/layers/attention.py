"""The attention layers models use: they declare their KV-cache spec and delegate to the bound backend.

`PagedAttentionLayer` is what the worker looks for: each one names the op whose backend computes it
("attention", or "mla_attention" for `MLAAttention`) and declares what it caches per token. The worker groups
the layers by op (`worker_proc/cache_groups.py`: one paged cache group per op, each with the backend the op
registry selected and its metadata built once per step), allocates each layer's paged tensor from its spec and
binds both (and, for a model mixing sliding-window and full layers, names each layer's group by its KV table),
so model code never sees cache layout or backend choice and the batch metadata is passed in as an
argument (no global forward context): `batch.attention` in a one-op model, `batch.metadata_for(layer)` in any.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from rapid_llm.ops.attention import AttentionMetadata
from rapid_llm.ops.attention.kv_cache_spec import FullAttentionSpec, KVCacheSpec
from rapid_llm.ops.attention.kv_quant import KVScales, is_fp8_kv


class PagedAttentionLayer(nn.Module, ABC):
    attention_op: ClassVar[str]  # the registry op whose backend this layer is bound to

    def __init__(self) -> None:
        super().__init__()
        self.kv_cache: torch.Tensor | None = None
        self.backend: Any = None
        # The paged cache group whose step metadata it reads: its op's, or the worker's name for the op's layers in
        # one KV table (sliding-window layers read a block table of their own).
        self.cache_group = self.attention_op

    @abstractmethod
    def kv_cache_spec(self, dtype: torch.dtype) -> KVCacheSpec:
        """What this layer caches per token, in the cache dtype."""

    def bind(self, kv_cache: torch.Tensor, backend: Any) -> None:
        self.kv_cache = kv_cache
        self.backend = backend

    def bound(self) -> tuple[torch.Tensor, Any]:
        if self.kv_cache is None or self.backend is None:
            raise RuntimeError("attention layer used before the worker bound it to a KV cache and backend")
        return self.kv_cache, self.backend


class Attention(PagedAttentionLayer):
    attention_op = "attention"

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int | None = None
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        # Per-tensor fp8 KV-cache scales: the checkpoint's k_scale/v_scale when it has them (the loader sets
        # them, `kv_scales.py`), else 1.0; unused unless the cache is fp8.
        self.kv_scales = KVScales()
        self.kv_scales_from_checkpoint = False

    def kv_cache_spec(self, dtype: torch.dtype) -> FullAttentionSpec:
        return FullAttentionSpec(dtype, self.num_kv_heads, self.head_dim, self.sliding_window, self.kv_scales)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        kv_cache, backend = self.bound()
        output = backend.forward(
            query.view(-1, self.num_heads, self.head_dim),
            key.view(-1, self.num_kv_heads, self.head_dim),
            value.view(-1, self.num_kv_heads, self.head_dim),
            kv_cache,
            metadata,
            self.scale,
            self.sliding_window,
            # Only fp8-capable backends are bound to an fp8 cache, and only they take the scales.
            **({"kv_scales": self.kv_scales} if is_fp8_kv(kv_cache.dtype) else {}),
        )
        return output.view(-1, self.num_heads * self.head_dim)
