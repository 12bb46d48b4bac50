"""GPTQ (Frantar et al., 2022) for one linear weight: quantize column by column, pushing each column's rounding
error onto the columns not yet quantized through the inverse Hessian of the layer's calibration inputs.

H = 2/n Σ xᵀx over the calibration rows; inputs never seen (zero diagonal) get weight 0. Damping adds
`damp` x mean(diag H) to the diagonal, then the upper Cholesky factor of H⁻¹ gives each column's update.
Columns are processed in blocks (lazy batch updates); a group's scale and zero are fitted on its columns as
they stand (already error-compensated) when the group's first column is reached. Act-order (`desc_act`)
visits columns by decreasing diag H; its groups are runs of that order, so g_idx names them per input channel.
Usage: `acc = HessianAccumulator(k); acc.add(x); q, scales, zeros, g_idx = gptq_quantize(w, acc.hessian(), 128, False)`.
"""

from __future__ import annotations

import torch

from rapid_llm.quantization.int4_math import group_params, quantize_values

BLOCK = 128  # columns per lazy batch update


class HessianAccumulator:
    """2/n Σ xᵀx of a linear layer's inputs, accumulated over calibration batches in float64."""

    def __init__(self, in_features: int) -> None:
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        self.sum += x.t() @ x
        self.rows += x.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.rows == 0:
            raise ValueError("no calibration rows reached this layer")
        return (2 * self.sum / self.rows).float()


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, sym: bool, desc_act: bool = False,
                  damp: float = 0.01, min_zero: int = 0,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 [out, in], scales fp32 [out, groups], zeros fp32 [out, groups], g_idx int32 [in]) for `weight`
    [out, in]; `group_size` -1: one group per row."""
    w = weight.detach().float().clone()
    out_features, in_features = w.shape
    group = in_features if group_size == -1 else group_size
    if in_features % group:
        raise ValueError(f"group size {group} does not divide the {in_features} input features")
    h = hessian.detach().float().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True) if desc_act else torch.arange(in_features)
    w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(in_features)
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    q = torch.zeros_like(w)
    groups = in_features // group
    scales, zeros = torch.zeros(out_features, groups), torch.zeros(out_features, groups)
    for start in range(0, in_features, BLOCK):
        end = min(start + BLOCK, in_features)
        block, errors, h_block = w[:, start:end].clone(), torch.zeros(out_features, end - start), h_inv[start:end, start:end]
        for i in range(end - start):
            column = start + i
            if column % group == 0:
                # The group's columns as they stand now: this block's from `block`, later ones from `w`.
                current = torch.cat([block[:, i:], w[:, end:]], dim=1)[:, :group]
                scale, zero = group_params(current, sym, min_zero)
                scales[:, column // group], zeros[:, column // group] = scale, zero
            scale, zero = scales[:, column // group], zeros[:, column // group]
            values = quantize_values(block[:, i], scale, zero)
            q[:, column] = values
            error = (block[:, i] - (values - zero) * scale) / h_block[i, i]
            block[:, i:] -= error[:, None] * h_block[i, i:][None, :]
            errors[:, i] = error
        w[:, end:] -= errors @ h_inv[start:end, end:]
    inverse = torch.argsort(perm)
    g_idx = (inverse // group).to(torch.int32)  # the group of each input channel, in the original order
    return q[:, inverse].to(torch.uint8), scales, zeros, g_idx
