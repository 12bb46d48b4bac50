"""The linear op's implementations are kernels that own a weight format: prepared once, applied per call.

A linear layer selects its kernel once, after its weights are loaded (`REGISTRY.select("linear", ...)`
on the weight's device and dtype), stores `kernel.prepare(weight)` in place of the checkpoint layout,
and calls `kernel(x, prepared, bias)` in its forward. So a kernel may repack the weight (oneDNN's
blocked layout, later quantized formats) without the layer knowing, and the hot path pays no dispatch.
`TorchLinear` is the reference: the checkpoint layout and `F.linear`.

Usage:
    kernel = REGISTRY.select("linear", weight.device, weight.dtype).fn
    prepared = kernel.prepare(weight)
    y = kernel(x, prepared, bias)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class LinearKernel:
    """y = x Wᵀ + b over a weight in this kernel's format; the base format is the checkpoint's [out, in]."""

    def prepare(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight in this kernel's format (called once per layer, after loading)."""
        return weight

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def fuses_silu_and_mul(self, weight: torch.Tensor) -> bool:
        """Whether `silu_and_mul_linear` takes this prepared weight (of a merged [gate; up] layer)."""
        return False

    def silu_and_mul_linear(self, x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
        """silu(gate) * up of `self(x, weight, bias)` = [gate | up] in one call, where fuses_silu_and_mul(weight)."""
        raise NotImplementedError


class TorchLinear(LinearKernel):
    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, weight, bias)


TORCH_LINEAR = TorchLinear()
