"""Rotary position embedding (RoPE) for Llama-family models, applied to flattened mixed batches.

Supports the rope types of Llama / Qwen2 / Qwen3 / Mistral configs: default, linear, dynamic (NTK),
llama3 and yarn, with the same math and float32 evaluation order as the installed transformers, so
rotated q/k match HF bit-for-bit in float32 and bfloat16. Static types precompute a cos/sin table
indexed by position; dynamic NTK cannot (its frequencies depend on the sequence length), so it
computes per-token frequencies from each token's own sequence length, vectorised over the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from rapid_llm import ops
from rapid_llm.config.model_config import derived_max_model_len, rope_parameters

_SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


def _base_inv_freq(base: float, dim: int, device: torch.device | None) -> torch.Tensor:
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    return 1.0 / (base**exponent)


def _llama3_inv_freq(params: dict[str, Any], dim: int, device: torch.device | None) -> torch.Tensor:
    inv_freq = _base_inv_freq(params["rope_theta"], dim, device)
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # Between the two wavelength bounds, blend scaled and unscaled frequencies (same op order as HF).
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, smoothed)
    return torch.where(wavelen < old_len / high, inv_freq, scaled)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention-magnitude factor for a context stretched `scale` times (DeepSeek also scales softmax by it)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(params: dict[str, Any], dim: int, device: torch.device | None) -> tuple[torch.Tensor, float]:
    base = params["rope_theta"]
    factor = params["factor"]
    orig_len = params["original_max_position_embeddings"]
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        # The rotary dimension whose wavelength completes `num_rotations` turns over the original length.
        return dim * math.log(orig_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # keeps the ramp finite
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device=device).to(torch.float32) / dim)
    extrapolation = 1 - ramp  # weight of the unscaled frequency: 1 for fast-rotating dims, 0 for slow ones
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class RotaryEmbedding(torch.nn.Module):
    """Applies RoPE to the first `rotary_dim` dims of every q/k head: neox style ("rotate_half", the
    default) or, with `is_neox_style=False`, gpt-j style (interleaved pairs, e.g. DeepSeek).

    Attributes: `rope_type`, `head_dim`, `rotary_dim`, `is_neox_style`, `max_positions` (positions must be
    below it for the static types), `attention_scaling` (cos/sin multiplier; yarn's mscale, else 1.0),
    `inv_freq`.

    Dynamic NTK: HF rescales the base from seq_len = max(position_ids) + 1 of the whole forward call
    (only when it exceeds max_position_embeddings). Here each token uses its own sequence's length from
    `seq_lens`, so results match HF for unchunked prefill and for decode. They differ only for a prompt
    prefilled in chunks past the original length: HF (unchunked) scales every prompt token by the full
    prompt length, while here an earlier chunk's tokens use the length reached at the end of that chunk.
    """

    def __init__(self, config: Any, head_dim: int, device: torch.device | None = None,
                 is_neox_style: bool = True) -> None:
        super().__init__()
        params = rope_parameters(config)
        self.rope_type: str = params["rope_type"]
        if self.rope_type not in _SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope type {self.rope_type!r}; supported: {', '.join(_SUPPORTED_ROPE_TYPES)}"
            )
        max_pos = int(config.max_position_embeddings)
        self.head_dim = head_dim
        self.is_neox_style = is_neox_style
        self.rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        self.attention_scaling = 1.0
        self.max_positions = derived_max_model_len(max_pos, params)
        self._base = float(params["rope_theta"])
        self._factor = float(params.get("factor") or 1.0)
        self._orig_max_pos = max_pos

        if self.rope_type == "llama3":
            params.setdefault("original_max_position_embeddings", max_pos)  # transformers 4.x configs may omit it
            inv_freq = _llama3_inv_freq(params, self.rotary_dim, device)
        elif self.rope_type == "yarn":
            params.setdefault("original_max_position_embeddings", max_pos)
            params["factor"] = params.get("factor") or max_pos / params["original_max_position_embeddings"]
            inv_freq, self.attention_scaling = _yarn_inv_freq(params, self.rotary_dim, device)
        else:
            # dynamic keeps the unscaled frequencies for sequences within the original length
            inv_freq = _base_inv_freq(self._base, self.rotary_dim, device)
            if self.rope_type == "linear":
                inv_freq = inv_freq / self._factor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

        if self.rope_type != "dynamic":
            # Same float32 ops as HF's per-call computation, done once; tables hold the half-width angles.
            angles = torch.arange(self.max_positions, device=device).to(torch.float32)[:, None] * inv_freq
            self.register_buffer("cos_cache", angles.cos() * self.attention_scaling, persistent=False)
            self.register_buffer("sin_cache", angles.sin() * self.attention_scaling, persistent=False)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RotaryEmbedding:
        # The tables must stay float32 when the model is cast to bf16 (HF rounds cos/sin only at use),
        # so follow device moves but undo dtype casts.
        float32_buffers = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, original in float32_buffers.items():
            moved = self._buffers[name]
            if moved.dtype != original.dtype:
                self._buffers[name] = original.to(device=moved.device)
        return self

    def _dynamic_cos_sin(
        self, positions: torch.Tensor, seq_lens: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq_lens = positions + 1 if seq_lens is None else seq_lens
        dim = self.rotary_dim
        # NTK base per token in HF's float32 operation order. The power is taken in float64 because HF
        # raises a 0-dim tensor, which CPU kernels evaluate in double precision (SIMD lanes would not).
        stretch = self._factor * seq_lens.to(torch.float32) / self._orig_max_pos - (self._factor - 1)
        base = self._base * (stretch.to(torch.float64) ** (dim / (dim - 2))).to(torch.float32)
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).to(torch.float32) / dim
        scaled = 1.0 / (base[:, None] ** exponent)
        # Short sequences keep the exact unscaled frequencies, as HF does.
        inv_freq = torch.where((seq_lens > self._orig_max_pos)[:, None], scaled, self.inv_freq)
        angles = positions.to(torch.float32)[:, None] * inv_freq
        return angles.cos(), angles.sin()

    def cos_sin(
        self, positions: torch.Tensor, seq_lens: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, rotary_dim / 2] for `positions` [T], rounded to `dtype` once (where HF rounds).

        `seq_lens` [T] (dynamic only; ignored otherwise): per token, its sequence's length after this
        step. Defaults to positions + 1.
        """
        if self.rope_type == "dynamic":
            cos, sin = self._dynamic_cos_sin(positions, seq_lens)
        else:
            cos, sin = self.cos_cache[positions], self.sin_cache[positions]
        return cos[:, None, :].to(dtype), sin[:, None, :].to(dtype)

    def rotate(
        self, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, H*D] or [T, H, D] and k (same with KV heads) with precomputed `cos_sin`
        (shared by every layer of one forward)."""
        return ops.rotary_embedding(query, key, cos, sin, self.head_dim, self.rotary_dim, self.is_neox_style)


def get_rope(config: Any, head_dim: int, device: torch.device | None = None,
             is_neox_style: bool = True) -> RotaryEmbedding:
    """Build the rotary embedding described by an HF config (rope_parameters, or rope_scaling on 4.x);
    `is_neox_style=False` rotates interleaved pairs (gpt-j style)."""
    return RotaryEmbedding(config, head_dim, device, is_neox_style)
