"""The gated (SwiGLU) MLP: down(silu(gate(x)) * up(x)), gate and up merged into one GEMM.

The dense MLP of Llama-family layers and the shared experts of MoE layers are this block at different
widths; checkpoint names `gate_proj`/`up_proj` load into `gate_up_proj` (LLAMA_STACKED_PARAMS).
With `reduce_results=False` (MoE shared experts) the output is this rank's partial sum and the caller reduces.
Usage: `GatedMLP(hidden_size, intermediate_size, bias=False)(x [T, H])`.
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.layers.activation import SiluAndMul
from rapid_llm.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 reduce_results: bool = True) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, reduce_results=reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
