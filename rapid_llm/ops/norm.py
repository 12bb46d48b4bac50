"""RMSNorm reference implementations, numerically in step with Hugging Face.

Normalisation runs in float32 and the result is cast back before the weight multiply, the order HF
uses, so bfloat16 outputs match it rather than drifting by a rounding step.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * normalise(x) over the last dim."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is the next layer's residual."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed
