"""Gated DeltaNet (Qwen3-Next's linear attention), a state-group layer with two states per request.

q, k, v go through a causal depthwise conv with SiLU (layers/causal_conv.py; state: the last kernel - 1 inputs),
then the gated delta rule keeps a [value heads, key dim, value dim] matrix S per request: for each token,
S = S * exp(g); S += k (beta * (v - S^T k))^T; o = S^T q (q, k L2-normalised, q scaled by key_dim^-0.5; g and beta
from the token's `a` and `b` projections). The output is RMS-normalised per head, gated by SiLU(z), projected out.
Key design choice: the rule runs token by token in float32 for every sequence of the step at once (a loop over
offsets, not sequences); the state is kept in float32 as transformers keeps it. A chunked form for long prefills
and a registered kernel are not built. Tensor parallel is not built (the model refuses it).
Usage: `GatedDeltaNet(config)` as a decoder layer's mixer, called (hidden_states, batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from rapid_llm.layers.causal_conv import ChannelConv, causal_conv
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.linear import ColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.state_layer import StateLayer, StateMetadata, token_offsets
from rapid_llm.ops.attention.kv_cache_spec import StateSpec


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
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.k_dim, self.v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_size, self.value_size = self.num_k_heads * self.k_dim, self.num_v_heads * self.v_dim
        self.conv_size = 2 * self.key_size + self.value_size
        self.kernel_size = config.linear_conv_kernel_dim
        self.in_proj_qkvz = ColumnParallelLinear(config.hidden_size, 2 * self.key_size + 2 * self.value_size)
        self.in_proj_ba = ColumnParallelLinear(config.hidden_size, 2 * self.num_v_heads)
        self.conv1d = ChannelConv(self.conv_size, self.kernel_size, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads), requires_grad=False)
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(self.value_size, config.hidden_size)

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        return StateSpec(torch.float32, ((self.conv_size, self.kernel_size - 1),
                                         (self.num_v_heads, self.k_dim, self.v_dim)))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        metadata: StateMetadata = batch.metadata_for(self)
        conv_state, recurrent_state = self.bound()
        num_tokens, group = hidden_states.shape[0], self.num_v_heads // self.num_k_heads
        # The checkpoint groups q, k, v, z (and b, a) per key head.
        qkvz = self.in_proj_qkvz(hidden_states).view(num_tokens, self.num_k_heads, -1)
        query, key, value, z = qkvz.split([self.k_dim, self.k_dim, group * self.v_dim, group * self.v_dim], dim=-1)
        b, a = self.in_proj_ba(hidden_states).view(num_tokens, self.num_k_heads, -1).split([group, group], dim=-1)
        mixed = torch.cat([query.reshape(num_tokens, -1), key.reshape(num_tokens, -1),
                           value.reshape(num_tokens, -1)], dim=-1)
        mixed = F.silu(causal_conv(mixed, conv_state, self.conv1d.weight[:, 0, :], None, metadata))
        query, key, value = mixed.split([self.key_size, self.key_size, self.value_size], dim=-1)
        beta = b.reshape(num_tokens, self.num_v_heads).sigmoid().float()
        decay = (-self.A_log.float().exp() * F.softplus(a.reshape(num_tokens, self.num_v_heads).float()
                                                         + self.dt_bias)).exp()
        query = l2_normalize(query.float().view(num_tokens, self.num_k_heads, self.k_dim))
        key = l2_normalize(key.float().view(num_tokens, self.num_k_heads, self.k_dim))
        query = query.repeat_interleave(group, dim=1) * self.k_dim**-0.5
        key = key.repeat_interleave(group, dim=1)
        output = self._delta_rule(query, key, value.float().view(num_tokens, self.num_v_heads, self.v_dim), decay,
                                  beta, recurrent_state, metadata).to(hidden_states.dtype)
        output = self.norm(output.reshape(-1, self.v_dim), z.reshape(-1, self.v_dim))
        return self.out_proj(output.view(num_tokens, self.value_size))

    @staticmethod
    def _delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor,
                    beta: torch.Tensor, state: torch.Tensor, metadata: StateMetadata) -> torch.Tensor:
        """Outputs [tokens, v_heads, v_dim], token by token, each sequence continuing from its state row."""
        output = torch.empty_like(value)
        for rows, slots, keep in token_offsets(metadata):
            matrix = state[slots] * decay[rows][..., None, None]  # [n, heads, k_dim, v_dim]
            k = key[rows]
            delta = (value[rows] - (matrix * k[..., None]).sum(dim=-2)) * beta[rows][..., None]
            matrix = matrix + k[..., None] * delta[..., None, :]
            output[rows] = (matrix * query[rows][..., None]).sum(dim=-2)
            state[slots] = matrix
            if keep is not None:
                index, targets = keep
                state[targets] = matrix[index]
        return output
