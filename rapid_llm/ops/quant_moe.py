"""The `quantized_fused_moe` op: routed experts whose weights stay quantized, each used expert dequantized per call.

The expert loop is fused_moe's (moe.py `expert_loop`: same routing, weighting, rounding and expert order); only
each GEMM differs: expert e's projection is the quantized linear op (`fp8_linear` / `fp4_linear`, selected once
when the weights are prepared) on `weight[e]` and the e-th slice of every per-expert scale tensor, so the result
is dequantize-then-matmul per expert and memory holds only the packed weights and their scales.
`ExpertScales` carries one projection's (w13 or w2) scales, linear op and spec; `QuantizedMoEKernel` binds a
layer's two (rapid_llm/quantization/moe_method.py), as Fp8LinearKernel binds a linear layer's scales.
Usage: `quantized_fused_moe(x [T, H], topk_weights, topk_ids, w13 [E, 2I, ...], w2 [E, H, ...], w13_scales,
w2_scales)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from rapid_llm.ops.moe import expert_loop
from rapid_llm.ops.moe_kernel import MoEKernel


@dataclass(frozen=True)
class ExpertScales:
    """One projection of every expert, less its packed weight: `linear(x, weight[e], *[t[e] for t in tensors],
    spec)` is expert e's GEMM (a None tensor passes as None)."""

    linear: Callable[..., torch.Tensor]
    tensors: tuple[torch.Tensor | None, ...]  # each [E, ...]
    spec: Any

    def gemm(self, rows: torch.Tensor, weight: torch.Tensor, expert: int) -> torch.Tensor:
        per_expert = (None if tensor is None else tensor[expert] for tensor in self.tensors)
        return self.linear(rows, weight[expert], *per_expert, self.spec)


class _Projection:
    """What expert_loop indexes: `shape` and `[e]`, here expert e's bound quantized GEMM."""

    def __init__(self, weight: torch.Tensor, scales: ExpertScales) -> None:
        self.weight, self.scales, self.shape = weight, scales, weight.shape

    def __getitem__(self, expert: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return partial(self.scales.gemm, weight=self.weight, expert=expert)


def _apply(rows: torch.Tensor, gemm: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    return gemm(rows)


def quantized_fused_moe(hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        w13: torch.Tensor, w2: torch.Tensor, w13_scales: ExpertScales, w2_scales: ExpertScales,
                        swiglu_limit: float | None = None) -> torch.Tensor:
    return expert_loop(hidden_states, topk_weights, topk_ids, _Projection(w13, w13_scales),
                       _Projection(w2, w2_scales), swiglu_limit, _apply)


class QuantizedMoEKernel(MoEKernel):
    """A `quantized_fused_moe` implementation bound to one layer's scales (the layer passes its packed weights)."""

    def __init__(self, fn: Callable[..., torch.Tensor], w13_scales: ExpertScales, w2_scales: ExpertScales) -> None:
        self.fn, self.w13_scales, self.w2_scales = fn, w13_scales, w2_scales

    def __call__(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 w13: torch.Tensor, w2: torch.Tensor, swiglu_limit: float | None = None) -> torch.Tensor:
        return self.fn(hidden_states, topk_weights, topk_ids, w13, w2, self.w13_scales, self.w2_scales, swiglu_limit)
