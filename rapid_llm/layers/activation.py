"""Gated activations for the MLP, computed through the op registry (`silu_and_mul`)."""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm import ops


class SiluAndMul(nn.Module):
    """silu(gate) * up, where the input is [..., 2 * intermediate] = [gate | up]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)
