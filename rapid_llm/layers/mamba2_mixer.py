"""Mamba2's mixer (NemotronH's "linear_attention" layers), a state-group layer with two states per request.

in_proj gives the gate z, xBC and dt per token; xBC goes through the causal depthwise conv (`ops.causal_conv`;
state: the last kernel - 1 inputs) and SiLU, then splits into x [heads, head_dim] and B, C [groups, state_dim]; the
scan (`ops.ssd_scan`, ops/ssd.py) keeps a [heads, head_dim, state_dim] matrix per request, with dt =
softplus(dt + dt_bias) and A = -exp(A_log). Its output times SiLU(z) is RMS-normalised per group, then projected out.
Key design choice: transformers' prefill dtypes on every path: dt in the model dtype, the scan and the gated norm
in float32, rounded once before out_proj (its decode path rounds between them, its prefill path does not); both
states are float32 (the conv state's model-dtype inputs fit exactly), as transformers keeps the SSM state.
Heads and groups split over tensor-parallel ranks: each chunk of in_proj (z, x, B, C, dt) and of the conv's
channels (x, B, C) on its own, the per-head parameters and the norm's groups by rank.
Usage: `Mamba2Mixer(config)` as a NemotronH layer's mixer, called (hidden_states, batch).
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
from rapid_llm.layers.linear import ChunkedColumnParallelLinear, RowParallelLinear
from rapid_llm.layers.state_layer import StateLayer
from rapid_llm.ops.attention.kv_cache_spec import StateSpec


class GroupedGatedRMSNorm(nn.Module):
    """x * SiLU(gate), RMS-normalised per group of `group_size` channels, times the weight, in float32 (as
    transformers' NemotronHRMSNormGated on the scan's float32 output); each rank holds its groups' weights."""

    def __init__(self, size: int, group_size: int, eps: float) -> None:
        super().__init__()
        self.group_size, self.eps = group_size, eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        self.weight.weight_loader = load_rank_rows  # this rank's rows

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        gated = x.float() * F.silu(gate.float())
        groups = gated.view(*gated.shape[:-1], -1, self.group_size)
        normed = groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.view_as(gated)


class Mamba2Mixer(StateLayer):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        ranks = get_tp_size()
        heads, groups = config.mamba_num_heads, config.n_groups
        if heads % groups or heads % ranks or groups % ranks:
            raise ValueError(f"Mamba2: the tensor-parallel size ({ranks}) must divide n_groups ({groups}), which "
                             f"must divide mamba_num_heads ({heads})")
        self.num_heads, self.num_groups = heads // ranks, groups // ranks
        self.head_dim, self.state_dim = config.mamba_head_dim, config.ssm_state_size
        inner, group_width = heads * self.head_dim, groups * self.state_dim
        self.inner_size, self.group_width = inner // ranks, group_width // ranks
        self.conv_size = self.inner_size + 2 * self.group_width
        self.kernel_size = config.conv_kernel
        self.dt_limit = tuple(config.time_step_limit)
        self.in_proj = ChunkedColumnParallelLinear(config.hidden_size, [inner, inner, group_width, group_width, heads],
                                                   bias=config.use_bias)
        self.conv1d = ChannelConv([inner, group_width, group_width], self.kernel_size, config.use_conv_bias)
        self.dt_bias, self.A_log, self.D = (self._per_head() for _ in range(3))
        self.norm = GroupedGatedRMSNorm(self.inner_size, inner // groups, config.layer_norm_epsilon)
        self.out_proj = RowParallelLinear(inner, config.hidden_size, bias=config.use_bias)

    def _per_head(self) -> nn.Parameter:
        parameter = nn.Parameter(torch.empty(self.num_heads), requires_grad=False)
        parameter.weight_loader = load_rank_rows  # this rank's heads
        return parameter

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        return StateSpec(torch.float32, ((self.conv_size, self.kernel_size - 1),
                                         (self.num_heads, self.head_dim, self.state_dim)))

    def forward(self, hidden_states: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        metadata = batch.metadata_for(self)
        conv_state, ssm_state = self.bound()
        num_tokens = hidden_states.shape[0]
        gate, xbc, dt = self.in_proj(hidden_states).split([self.inner_size, self.conv_size, self.num_heads], dim=-1)
        xbc = F.silu(ops.causal_conv(xbc, conv_state, self.conv1d.weight[:, 0, :], self.conv1d.bias, metadata))
        x, B, C = xbc.split([self.inner_size, self.group_width, self.group_width], dim=-1)
        dt = F.softplus(dt + self.dt_bias.to(dt.dtype)).clamp(*self.dt_limit)
        output = ops.ssd_scan(x.reshape(num_tokens, self.num_heads, self.head_dim), dt, -self.A_log.float().exp(),
                              B.reshape(num_tokens, self.num_groups, self.state_dim),
                              C.reshape(num_tokens, self.num_groups, self.state_dim), self.D, ssm_state, metadata)
        output = self.norm(output.view(num_tokens, self.inner_size), gate)
        return self.out_proj(output.to(hidden_states.dtype))
