"""fused_moe's implementations are kernels that own the expert weights' format: prepared once, applied per call.

Like linear kernels (linear_kernel.py): FusedExperts selects its kernel once after loading
(`REGISTRY.select("fused_moe", ...)` on the weights' device and dtype), stores `kernel.prepare(w13, w2)` in
place of the checkpoint layout and calls `kernel(x, topk_weights, topk_ids, w13, w2[, swiglu_limit])`, so
a kernel may repack the stacked experts (cpu_amx's tiles) and the hot path pays no dispatch. `ops.fused_moe`
still dispatches calls on checkpoint-layout weights, so every kernel accepts that layout too.
`CheckpointLayoutMoE` wraps a function of the op's signature that computes on the checkpoint layout.
Usage: `kernel = REGISTRY.select("fused_moe", w13.device, w13.dtype).fn; w13, w2 = kernel.prepare(w13, w2)`.
"""

from __future__ import annotations

from typing import Callable

import torch


class MoEKernel:
    """Routed experts' SwiGLU MLPs, weighted and summed, over w13 [E, 2I, H] / w2 [E, H, I] in this kernel's format."""

    def prepare(self, w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13, w2) in this kernel's format; the base format is the checkpoint's, and prepared weights pass."""
        return w13, w2

    def __call__(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 w13: torch.Tensor, w2: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
        raise NotImplementedError


class CheckpointLayoutMoE(MoEKernel):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        self.fn = fn

    def __call__(self, *args: object) -> torch.Tensor:
        return self.fn(*args)
