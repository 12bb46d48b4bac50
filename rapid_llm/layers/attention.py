"""The attention layer models use: reshapes heads and delegates to the bound backend.

The worker binds each layer to its KV-cache tensor and the attention backend the op registry
selected (the "attention" op) after the model is built, so model code never sees cache layout or backend choice and the batch metadata is
passed in as an argument (no global forward context).
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.ops.attention import AttentionBackend, AttentionMetadata


class Attention(nn.Module):
    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int | None = None
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.kv_cache: torch.Tensor | None = None
        self.backend: AttentionBackend | None = None

    def bind(self, kv_cache: torch.Tensor, backend: AttentionBackend) -> None:
        self.kv_cache = kv_cache
        self.backend = backend

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        if self.kv_cache is None or self.backend is None:
            raise RuntimeError("attention layer used before the worker bound it to a KV cache and backend")
        output = self.backend.forward(
            query.view(-1, self.num_heads, self.head_dim),
            key.view(-1, self.num_kv_heads, self.head_dim),
            value.view(-1, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            metadata,
            self.scale,
            self.sliding_window,
        )
        return output.view(-1, self.num_heads * self.head_dim)
