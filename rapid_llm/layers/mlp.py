"""The gated (SwiGLU) MLP: down(silu(gate(x)) * up(x)), gate and up merged into one GEMM.

The dense MLP of Llama-family layers and the shared experts of MoE layers are this block at different
widths; checkpoint names `gate_proj`/`up_proj` load into `gate_up_proj` (LLAMA_STACKED_PARAMS).
Where the gate_up kernel has a gated form (`cpu_amx`, `cpu_avx512`), silu_and_mul runs in its epilogue instead of
as an op of its own (so an `--op-backend silu_and_mul=...` pin does not reach these MLPs then).
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

    def activated(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate(x)) * up(x), the down projection's input."""
        gate_up = self.gate_up_proj
        # The activation inside the GEMM where the kernel has that form; a wrapper (LoRA adds to gate_up's
        # output before the activation) makes the type differ and takes the two calls.
        if type(gate_up) is MergedColumnParallelLinear and gate_up.kernel.fuses_silu_and_mul(gate_up.weight):
            return gate_up.kernel.silu_and_mul_linear(x, gate_up.weight, gate_up.bias)
        return self.act_fn(gate_up(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activated(x))
