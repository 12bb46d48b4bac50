"""Manifold-constrained hyper-connections (DeepSeek-V4's mHC): `hc_mult` residual streams instead of one.

Each token carries streams [T, n, H]. Before a block, `HyperConnection` derives from the RMS-normed,
flattened streams (one linear map, in fp32 like transformers) the weights that collapse the streams into
the block's input ("pre"), expand the block's output back onto the streams ("post") and mix the old
streams into the new ones ("comb", projected onto doubly-stochastic matrices by Sinkhorn iterations); the
block's residual is then `post * out + comb^T @ streams`. `HyperHead` collapses the streams once more
before the final norm. Parameter names are the checkpoint's.
Usage: `post, comb, x = hc(streams)`; `streams = hc.merge(streams, block(x), post, comb)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dimension (no weight), the statistic in fp32 and the product in x's dtype."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def _fp32_parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=torch.float32), requires_grad=False)


class HyperConnection(nn.Module):
    """fn [(2 + n) * n, n * H], base [(2 + n) * n] and scale [3] (pre, post, comb) of one block's mHC."""

    def __init__(self, hidden_size: int, hc_mult: int, sinkhorn_iters: int, hc_eps: float, norm_eps: float) -> None:
        super().__init__()
        if sinkhorn_iters < 1:
            raise ValueError(f"hc_sinkhorn_iters must be >= 1, got {sinkhorn_iters}")
        self.hc_mult, self.sinkhorn_iters, self.hc_eps, self.norm_eps = hc_mult, sinkhorn_iters, hc_eps, norm_eps
        self.fn = _fp32_parameter((2 + hc_mult) * hc_mult, hc_mult * hidden_size)
        self.base = _fp32_parameter((2 + hc_mult) * hc_mult)
        self.scale = _fp32_parameter(3)

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """streams [T, n, H] -> (post [T, n], comb [T, n, n], the block's input [T, H])."""
        n = self.hc_mult
        mixes = F.linear(unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps), self.fn)
        pre_w, post_w, comb_w = mixes.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre_scale, post_scale, comb_scale = self.scale.unbind(0)
        pre = torch.sigmoid(pre_w * pre_scale + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post_w * post_scale + post_b)
        comb = torch.softmax(comb_w.view(-1, n, n) * comb_scale + comb_b.view(n, n), dim=-1) + self.hc_eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
        for _ in range(self.sinkhorn_iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.hc_eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.hc_eps)
        collapsed = (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
        return post, comb, collapsed

    @staticmethod
    def merge(streams: torch.Tensor, output: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """The block's new streams: its output expanded by `post` plus the old streams mixed by comb^T."""
        dtype = streams.dtype
        return post.to(dtype).unsqueeze(-1) * output.unsqueeze(-2) + comb.to(dtype).transpose(-1, -2) @ streams


class HyperHead(nn.Module):
    """hc_fn [n, n * H], hc_base [n], hc_scale [1]: the final sigmoid-weighted collapse of the streams."""

    def __init__(self, hidden_size: int, hc_mult: int, hc_eps: float, norm_eps: float) -> None:
        super().__init__()
        self.hc_eps, self.norm_eps = hc_eps, norm_eps
        self.hc_fn = _fp32_parameter(hc_mult, hc_mult * hidden_size)
        self.hc_base = _fp32_parameter(hc_mult)
        self.hc_scale = _fp32_parameter(1)

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        mixes = F.linear(unweighted_rms_norm(streams.flatten(1).float(), self.norm_eps), self.hc_fn)
        pre = torch.sigmoid(mixes * self.hc_scale + self.hc_base) + self.hc_eps
        return (pre.unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
