"""Rotary embedding reference implementation: neox ("rotate_half") or gpt-j (interleaved) style.

Only the leading `rotary_dim` dims of each head rotate (partial rotary); the rest pass through.
Neox pairs dim i with i + rotary_dim / 2, gpt-j pairs dims 2i and 2i + 1 (DeepSeek's interleaved
layout); both rotate pair i by angle i. The cos/sin tables are the layer's
(rapid_llm/layers/rotary_embedding.py); this op only rotates.
"""

from __future__ import annotations

import torch


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int,
            is_neox_style: bool) -> torch.Tensor:
    heads = x.reshape(x.shape[0], -1, head_dim)
    if is_neox_style:
        half = rotary_dim // 2
        x1, x2 = heads[..., :half], heads[..., half:rotary_dim]
    else:
        x1, x2 = heads[..., 0:rotary_dim:2], heads[..., 1:rotary_dim:2]
    # Equals HF's x*cos + rotate_half(x)*sin op for op in x.dtype, without materialising rotate_half.
    first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if is_neox_style:
        rotated = torch.cat((first, second), dim=-1)
    else:
        rotated = torch.stack((first, second), dim=-1).flatten(-2)
    return torch.cat((rotated, heads[..., rotary_dim:]), dim=-1).reshape(x.shape)


def rotary_embedding(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, rotary_dim: int,
    is_neox_style: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H*D] or [T, H, D] and k (KV heads) by cos/sin [T, 1, rotary_dim / 2]."""
    return (_rotate(query, cos, sin, head_dim, rotary_dim, is_neox_style),
            _rotate(key, cos, sin, head_dim, rotary_dim, is_neox_style))
