"""AWQ (Lin et al., 2023) scale search: per input channel scales s from the activations' mean magnitude, chosen on a
grid so that round-to-nearest of W·diag(s) loses least on the calibration inputs.

For linear layers sharing one input x (q/k/v; gate/up; or one layer), s = mean|x|^α divided by √(max s · min s),
α on a grid of `GRID` points in [0, 1); the loss is the mean squared error of x·(Q(W·s)/s)ᵀ against
x·Wᵀ over all of them. α = 0 (s = 1) is plain RTN, so the search never does worse than RTN on these inputs.
The caller folds 1/s into what produces x (the norm's weight, or the preceding linear's output rows) and s
into the weights, which it then quantizes by RTN.
Usage: `s = search_scales(x_rows, [q.weight, k.weight, v.weight], 128)`.
"""

from __future__ import annotations

import torch

from rapid_llm.quantization.int4_math import dequantize, quantize_rtn

GRID = 20


def _rtn(w: torch.Tensor, group_size: int) -> torch.Tensor:
    q, scales, zeros = quantize_rtn(w, group_size, sym=False)
    return dequantize(q, scales, zeros, group_size, torch.float32)


def search_scales(x: torch.Tensor, weights: list[torch.Tensor], group_size: int) -> torch.Tensor:
    """The per-input-channel scales [in] (fp32) minimizing the RTN output error of `weights` on rows `x` [n, in]."""
    x = x.float()
    w = torch.cat([weight.float() for weight in weights])
    group = w.shape[1] if group_size == -1 else group_size
    reference = x @ w.t()
    magnitude = x.abs().mean(dim=0).clamp(min=1e-8)
    best, best_loss = torch.ones_like(magnitude), None
    for step in range(GRID):
        alpha = step / GRID
        s = magnitude.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        loss = ((x @ (_rtn(w * s, group) / s).t() - reference) ** 2).mean().item()
        if best_loss is None or loss < best_loss:
            best, best_loss = s, loss
    return best
