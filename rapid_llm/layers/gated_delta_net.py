"""Gated DeltaNet (Qwen3-Next's linear attention), a state-group layer with two states per request.

q, k, v go through a causal depthwise conv with SiLU (op causal_conv; state: the last kernel - 1 inputs), then the
gated delta rule (op gated_delta_rule, ops/gated_delta.py) keeps a [value heads, key dim, value dim] matrix S per
request (q, k L2-normalised, q scaled by key_dim^-0.5; the log decay g and beta come from the token's `a` and `b`
projections). The output is RMS-normalised per head, gated by SiLU(z), projected out.
Key design choice: the rule runs in float32 and the state is kept in float32, as transformers keeps it.
Usage: `GatedDeltaNet(config, grouped)` as a decoder layer's mixer, called (hidden_states, batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from rapid_llm import ops
from rapid_llm.distributed import get_tp_size
from rapid_llm.layers.causal_conv import ChannelConv, load_rank_rows
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.linear import ChunkedColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.ops.attention.kv_cache_spec import StateSpec
from rapid_llm.ops.state_metadata import StateMetadata


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's values, then times SiLU(gate) (in transformers' order and dtypes)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed.to(dtype) * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(StateLayer):
    """`grouped`: the checkpoint's projections are Qwen3-Next's in_proj_qkvz and in_proj_ba, which group q, k, v, z
    (and b, a) per key head, one merged projection here (`in_proj`); otherwise Qwen3.5's in_proj_qkv (q, k, v, each
    flat: `in_proj_qkv`) and in_proj_z, in_proj_b, in_proj_a (merged: `in_proj_zba`). Tensor parallel ranks hold
    whole key heads and their value heads: a contiguous slice of the grouped projections, a slice of each chunk
    of the flat ones and of the conv's q, k, v channels."""

    def __init__(self, config: PretrainedConfig, grouped: bool) -> None:
        super().__init__()
        ranks = get_tp_size()
        if config.linear_num_key_heads % ranks:
            raise ValueError(f"Gated DeltaNet's {config.linear_num_key_heads} key heads do not divide over "
                             f"--tensor-parallel-size {ranks}")
        self.num_k_heads = config.linear_num_key_heads // ranks
        self.num_v_heads = config.linear_num_value_heads // ranks
        self.k_dim, self.v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_size, self.value_size = self.num_k_heads * self.k_dim, self.num_v_heads * self.v_dim
        self.conv_size = 2 * self.key_size + self.value_size
        self.kernel_size = config.linear_conv_kernel_dim
        self.grouped = grouped
        key_size, value_size = self.key_size * ranks, self.value_size * ranks
        v_heads = self.num_v_heads * ranks
        if grouped:
            self.in_proj = MergedColumnParallelLinear(config.hidden_size, [2 * key_size + 2 * value_size, 2 * v_heads])
        else:
            self.in_proj_qkv = ChunkedColumnParallelLinear(config.hidden_size, [key_size, key_size, value_size])
            self.in_proj_zba = MergedColumnParallelLinear(config.hidden_size, [value_size, v_heads, v_heads])
        self.conv1d = ChannelConv([key_size, key_size, value_size], self.kernel_size, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads), requires_grad=False)
        for parameter in (self.dt_bias, self.A_log):
            parameter.weight_loader = load_rank_rows
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(value_size, config.hidden_size)

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        return StateSpec(torch.float32, ((self.conv_size, self.kernel_size - 1),
                                         (self.num_v_heads, self.k_dim, self.v_dim)))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        metadata: StateMetadata = batch.metadata_for(self)
        conv_state, recurrent_state = self.bound()
        num_tokens = hidden_states.shape[0]
        mixed, z, b, a = self._project(hidden_states)
        mixed = F.silu(ops.causal_conv(mixed, conv_state, self.conv1d.weight[:, 0, :], None, metadata))
        query, key, value = mixed.split([self.key_size, self.key_size, self.value_size], dim=-1)
        beta = b.sigmoid().float()
        log_decay = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        query = l2_normalize(query.float().view(num_tokens, self.num_k_heads, self.k_dim)) * self.k_dim**-0.5
        key = l2_normalize(key.float().view(num_tokens, self.num_k_heads, self.k_dim))
        output = ops.gated_delta_rule(query, key, value.float().view(num_tokens, self.num_v_heads, self.v_dim),
                                      log_decay, beta, recurrent_state, metadata).to(hidden_states.dtype)
        output = self.norm(output.reshape(-1, self.v_dim), z.reshape(-1, self.v_dim))
        return self.out_proj(output.view(num_tokens, self.value_size))

    def _project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(conv inputs [T, q | k | v], z [T, value size], b [T, v heads], a [T, v heads]), heads in order."""
        if not self.grouped:
            z, b, a = self.in_proj_zba(hidden_states).split([self.value_size, self.num_v_heads, self.num_v_heads],
                                                            dim=-1)
            return self.in_proj_qkv(hidden_states), z, b, a
        num_tokens, group = hidden_states.shape[0], self.num_v_heads // self.num_k_heads
        qkvz, ba = self.in_proj(hidden_states).split([self.conv_size + self.value_size, 2 * self.num_v_heads], dim=-1)
        qkvz = qkvz.reshape(num_tokens, self.num_k_heads, -1)
        query, key, value, z = qkvz.split([self.k_dim, self.k_dim, group * self.v_dim, group * self.v_dim], dim=-1)
        b, a = ba.reshape(num_tokens, self.num_k_heads, -1).split([group, group], dim=-1)
        mixed = torch.cat([query.reshape(num_tokens, -1), key.reshape(num_tokens, -1),
                           value.reshape(num_tokens, -1)], dim=-1)
        return (mixed, z.reshape(num_tokens, -1), b.reshape(num_tokens, -1), a.reshape(num_tokens, -1))
