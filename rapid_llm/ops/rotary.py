"""Rotary embedding reference implementation: neox style ("rotate_half") on the leading rotary dims.

The cos/sin tables are the layer's (rapid_llm/layers/rotary_embedding.py); this op only rotates.
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int) -> torch.Tensor:
    heads = x.reshape(x.shape[0], -1, head_dim)
    half = rotary_dim // 2
    x1, x2 = heads[..., :half], heads[..., half:rotary_dim]
    # Equals HF's x*cos + rotate_half(x)*sin op for op in x.dtype, without materialising rotate_half.
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, heads[..., rotary_dim:]), dim=-1)
    return rotated.reshape(x.shape)


def rotary_embedding(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H*D] or [T, H, D] and k (KV heads) by cos/sin [T, 1, rotary_dim / 2]."""
    return _rotate(query, cos, sin, head_dim, rotary_dim), _rotate(key, cos, sin, head_dim, rotary_dim)
