"""The DeepSeek-V4 attention backend interface: the `dsv4_attention` op's implementations.

A V4 layer attends, per query, over a sliding window of shared K=V rows plus compressed entries: one per
closed window of `rate` tokens, pooled by the layer's compressor (all of them on HCA layers, the Lightning
Indexer's top-k on CSA layers), with a learned per-head sink logit in the softmax. Everything lives in one
paged row per token (`DeepseekV4Spec`): a backend writes the step's rows, pools every window a token of this
step closes (reading the raw compressor inputs of earlier steps back from the cache, the layer supplies the
pooling math), then attends. Metadata is the `attention` op's per-step structure.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from rapid_llm.ops.attention.backend import AttentionMetadata, StepLayout
from rapid_llm.ops.attention.kv_cache_spec import DeepseekV4Spec

# (kv rows, gate rows [N, series, rate, series * width], window valid [N, series], window start [N]) -> [N, width]
PoolWindows = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class CompressorInputs:
    """One compressor's raw projections of the step's tokens and the layer's pooling of a closed window."""

    kv: torch.Tensor  # [T, series * width]
    gate: torch.Tensor  # [T, series * width]
    pool: PoolWindows


@dataclass
class IndexerQuery:
    """The Lightning Indexer's side of a CSA layer: rotated queries, per-head weights and the top-k size."""

    query: torch.Tensor  # [T, index_heads, index_head_dim]
    weights: torch.Tensor  # [T, index_heads], already scaled
    scale: float  # applied to relu(q . k) before the weights
    top_k: int


class DeepseekV4Backend(ABC):
    """Sliding-window + compressed sparse attention with sinks over one mixed prefill/extend/decode batch."""

    @abstractmethod
    def build_metadata(self, layout: StepLayout, device: torch.device) -> AttentionMetadata:
        """Turn the host-side layout into device tensors, once per step."""

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        kv: torch.Tensor,
        compressors: Sequence[CompressorInputs],
        indexer: IndexerQuery | None,
        sinks: torch.Tensor,
        kv_cache: torch.Tensor,
        spec: DeepseekV4Spec,
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int,
    ) -> torch.Tensor:
        """query [T, H, D] (rotated), kv [T, D] (the shared key and value, rotated), one CompressorInputs per
        compressor of `spec` (attention's first, then the indexer's), sinks [H] -> output [T, H, D].

        Rows are written before attending, so tokens see themselves and prefix-cache blocks written in the
        same step are readable, as with the other attention ops.
        """
