"""DeepSeek-V4 attention: shared-KV multi-query attention with sinks over a sliding window plus compressed KV.

One `wkv` projection is both key and value of a single KV head; the query is low-rank (wq_a -> q_norm ->
wq_b, then an unweighted per-head RMS norm). RoPE is interleaved and partial, on the *last* rope dims of a
head, and is undone (rotation by -position) on the output, whose heads then go through the grouped low-rank
projection (wo_a per head group, wo_b). Compressed layers add a `Compressor` (HCA: windows of `rate`
tokens; CSA: overlapping windows of 2 * rate, two series per token) and CSA a Lightning `Indexer` that picks
each query's top-k entries. The paged row layout and the attention itself belong to the `dsv4_attention`
op (ops/attention/dsv4_*.py); this module owns the projections and the pooling math.
Usage: `DeepseekV4Attention(config, layer_id, ropes)(hidden [T, H], batch) -> [T, H]`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Sequence

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.attention import PagedAttentionLayer
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.hyper_connection import unweighted_rms_norm
from rapid_llm.layers.linear import LinearBase
from rapid_llm.layers.rotary_embedding import RotaryEmbedding
from rapid_llm.ops.attention.backend import AttentionMetadata
from rapid_llm.ops.attention.dsv4_backend import CompressorInputs, IndexerQuery
from rapid_llm.ops.attention.kv_cache_spec import DeepseekV4Spec

LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")


def make_ropes(config: PretrainedConfig) -> dict[str, RotaryEmbedding]:
    """The "main" (sliding layers) and "compress" (compressed layers, compressors, indexer) rotary tables."""
    return {name: RotaryEmbedding(SimpleNamespace(rope_parameters=params,
                                                  max_position_embeddings=config.max_position_embeddings),
                                  config.head_dim, is_neox_style=False)
            for name, params in config.rope_parameters.items()}


class Fp32RMSNorm(nn.Module):
    """RMSNorm with a float32 weight, multiplied in float32 and rounded once (transformers keeps DeepSeek-V4's
    norms in float32; the shared RMSNorm rounds before its weight multiply)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=torch.float32), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (self.weight * (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps))).to(x.dtype)


def rotate_tail(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE on the last 2 * cos.shape[-1] dims of x [T, heads, D] (cos/sin [T, 1, rope / 2])."""
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    nope, rope = x[..., : -cos.shape[-1]], x[..., -cos.shape[-1]:]
    rotated_half = torch.stack((-rope[..., 1::2], rope[..., 0::2]), dim=-1).flatten(-2)
    rotated = (rope.float() * cos + rotated_half.float() * sin).to(x.dtype)
    return torch.cat([nope, rotated], dim=-1)


class Compressor(nn.Module):
    """wkv/wgate [series * width, H], ape [rate, series * width] (fp32) and norm: pools a window of raw
    projections into one entry (softmax over the window of gate + ape, weighting kv), RMS-normed and rotated
    at the window's first position. CSA (`overlap`) pools the first series of the previous window with the
    second of the current one."""

    def __init__(self, hidden_size: int, width: int, rate: int, overlap: bool, eps: float,
                 rope: RotaryEmbedding) -> None:
        super().__init__()
        self.width, self.rate, self.overlap = width, rate, overlap
        series = 2 if overlap else 1
        self.wkv = LinearBase(hidden_size, series * width, bias=False)
        self.wgate = LinearBase(hidden_size, series * width, bias=False)
        self.ape = nn.Parameter(torch.empty(rate, series * width, dtype=torch.float32), requires_grad=False)
        self.norm = Fp32RMSNorm(width, eps)
        self.rope = rope

    def inputs(self, hidden_states: torch.Tensor) -> CompressorInputs:
        return CompressorInputs(self.wkv(hidden_states), self.wgate(hidden_states), self.pool)

    def pool(self, kv: torch.Tensor, gate: torch.Tensor, valid: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """kv/gate [N, series, rate, series * width] of the windows ending at N closing tokens -> [N, width]."""
        gate = gate + self.ape
        if self.overlap:
            width = self.width
            previous_gate = gate[:, 0, :, :width].masked_fill(~valid[:, 0, None, None], float("-inf"))
            previous_kv = kv[:, 0, :, :width].masked_fill(~valid[:, 0, None, None], 0.0)
            kv = torch.cat([previous_kv, kv[:, 1, :, width:]], dim=1)
            gate = torch.cat([previous_gate, gate[:, 1, :, width:]], dim=1)
        else:
            kv, gate = kv[:, 0], gate[:, 0]
        pooled = self.norm((kv * gate.softmax(dim=1, dtype=torch.float32).to(kv.dtype)).sum(dim=1))
        cos, sin = self.rope.cos_sin(start, None, pooled.dtype)
        return rotate_tail(pooled.unsqueeze(1), cos, sin).squeeze(1)


class Indexer(nn.Module):
    """The Lightning Indexer of a CSA layer: its own overlapping compressor at index_head_dim, queries from the
    low-rank query residual (wq_b), per-head weights (weights_proj) scaled by index_n_heads ** -0.5."""

    def __init__(self, config: PretrainedConfig, rate: int, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.top_k = config.index_n_heads, config.index_head_dim, config.index_topk
        self.wq_b = LinearBase(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.weights_proj = LinearBase(config.hidden_size, self.num_heads, bias=False)
        self.compressor = Compressor(config.hidden_size, self.head_dim, rate, True, config.rms_norm_eps, rope)
        self.rope = rope

    def query(self, hidden_states: torch.Tensor, q_residual: torch.Tensor, batch: ForwardBatch) -> IndexerQuery:
        rope = self.rope
        cos, sin = batch.once(rope, lambda: rope.cos_sin(batch.positions, None, hidden_states.dtype))
        query = rotate_tail(self.wq_b(q_residual).view(-1, self.num_heads, self.head_dim), cos, sin)
        weights = self.weights_proj(hidden_states).float() * self.num_heads**-0.5
        return IndexerQuery(query, weights, self.head_dim**-0.5, self.top_k)


class DeepseekV4AttentionCore(PagedAttentionLayer):
    """The paged part: declares the layer's `DeepseekV4Spec` and calls the bound `dsv4_attention` backend."""

    attention_op = "dsv4_attention"

    def __init__(self, num_heads: int, head_dim: int, sliding_window: int, compressor_widths: tuple[int, ...],
                 rate: int, overlap: bool) -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.sliding_window = num_heads, head_dim, sliding_window
        self.compressor_widths, self.rate, self.overlap = compressor_widths, rate, overlap

    def kv_cache_spec(self, dtype: torch.dtype) -> DeepseekV4Spec:
        return DeepseekV4Spec(dtype, self.head_dim, self.compressor_widths, self.rate, self.overlap)

    def forward(self, query: torch.Tensor, kv: torch.Tensor, compressors: Sequence[CompressorInputs],
                indexer: IndexerQuery | None, sinks: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        kv_cache, backend = self.bound()
        return backend.forward(query, kv, compressors, indexer, sinks, kv_cache, self.kv_cache_spec(kv_cache.dtype),
                               metadata, self.head_dim**-0.5, self.sliding_window)


class DeepseekV4Attention(nn.Module):
    """The checkpoint's `attn` block of one layer (its `layer_types` entry picks the compressors)."""

    def __init__(self, config: PretrainedConfig, layer_id: int, ropes: dict[str, RotaryEmbedding]) -> None:
        super().__init__()
        layer_type = config.layer_types[layer_id]
        if layer_type not in LAYER_TYPES:
            raise ValueError(f"layer_types[{layer_id}] must be one of {LAYER_TYPES}, got {layer_type!r}")
        heads, head_dim, groups = config.num_attention_heads, config.head_dim, config.o_groups
        if heads % groups:
            raise ValueError(f"o_groups ({groups}) must divide num_attention_heads ({heads})")
        self.num_heads, self.head_dim, self.groups, self.eps = heads, head_dim, groups, config.rms_norm_eps
        self.wq_a = LinearBase(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_norm = Fp32RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.wq_b = LinearBase(config.q_lora_rank, heads * head_dim, bias=False)
        self.wkv = LinearBase(config.hidden_size, head_dim, bias=False)
        self.norm = Fp32RMSNorm(head_dim, config.rms_norm_eps)
        # wo_a is block-diagonal (one [o_lora_rank, heads/groups * head_dim] block per group), applied as a bmm.
        self.wo_a = nn.Module()
        self.wo_a.weight = nn.Parameter(torch.empty(groups * config.o_lora_rank, heads * head_dim // groups),
                                        requires_grad=False)
        self.wo_b = LinearBase(groups * config.o_lora_rank, config.hidden_size, bias=False)
        self.attn_sink = nn.Parameter(torch.empty(heads, dtype=torch.float32), requires_grad=False)
        self.rope = ropes["main" if layer_type == "sliding_attention" else "compress"]
        self.compressor: Compressor | None = None
        self.indexer: Indexer | None = None
        widths: tuple[int, ...] = ()
        rate = 0
        if layer_type != "sliding_attention":
            rate = config.compress_rates[layer_type]
            overlap = layer_type == "compressed_sparse_attention"
            self.compressor = Compressor(config.hidden_size, head_dim, rate, overlap, config.rms_norm_eps,
                                         ropes["compress"])
            widths = (head_dim,)
            if overlap:
                self.indexer = Indexer(config, rate, ropes["compress"])
                widths = (head_dim, config.index_head_dim)
        self.core = DeepseekV4AttentionCore(heads, head_dim, config.sliding_window, widths, rate,
                                            layer_type == "compressed_sparse_attention")

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        rope = self.rope
        cos, sin = batch.once(rope, lambda: rope.cos_sin(batch.positions, None, hidden_states.dtype))
        q_residual = self.q_norm(self.wq_a(hidden_states))
        query = unweighted_rms_norm(self.wq_b(q_residual).view(-1, self.num_heads, self.head_dim), self.eps)
        query = rotate_tail(query, cos, sin)
        kv = rotate_tail(self.norm(self.wkv(hidden_states)).unsqueeze(1), cos, sin).squeeze(1)
        compressors = [] if self.compressor is None else [self.compressor.inputs(hidden_states)]
        indexer = None
        if self.indexer is not None:
            compressors.append(self.indexer.compressor.inputs(hidden_states))
            indexer = self.indexer.query(hidden_states, q_residual, batch)
        output = self.core(query, kv, compressors, indexer, self.attn_sink, batch.attention)
        output = rotate_tail(output, cos, -sin)  # K = V carried the keys' rotation into the values
        grouped = output.reshape(-1, self.groups, self.num_heads * self.head_dim // self.groups).transpose(0, 1)
        weight = self.wo_a.weight.view(self.groups, -1, grouped.shape[-1])
        return self.wo_b(torch.bmm(grouped, weight.transpose(1, 2)).transpose(0, 1).flatten(1))
