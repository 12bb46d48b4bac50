"""Gated-activation reference implementation: the merged gate_up output is split and combined here."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, where x is [..., 2 * intermediate] = [gate | up]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def clamped_silu_and_mul(x: torch.Tensor, limit: float) -> torch.Tensor:
    """DeepSeek-V4's SwiGLU: silu(gate clamped to <= limit) * (up clamped to [-limit, limit])."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
