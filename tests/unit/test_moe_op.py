"""fused_moe (torch_ref) against a direct per-token transcription of transformers' expert loop: each chosen
expert's SwiGLU output times its routing weight (in the weights' dtype), rounded, summed in expert order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rapid_llm import ops
from rapid_llm.config.dtypes import dtype_from_name

HIDDEN, INTERMEDIATE, EXPERTS = 32, 24, 6
TOLERANCES = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, dtype=dtype) * 0.2,
            torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, dtype=dtype) * 0.2)


def _route(tokens: int, top_k: int, weights_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    values, ids = torch.randn(tokens, EXPERTS).topk(top_k, dim=-1)
    return values.softmax(dim=-1).to(weights_dtype), ids


def per_token(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor) -> torch.Tensor:
    rows = []
    for token, weights, experts in zip(x, topk_weights, topk_ids.tolist()):
        row = torch.zeros_like(token)
        for weight, expert in sorted(zip(weights, experts), key=lambda pair: pair[1]):
            gate, up = F.linear(token, w13[expert]).chunk(2)
            row = row + (F.linear(F.silu(gate) * up, w2[expert]) * weight).to(x.dtype)
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("fp32_weights", [False, True])  # Qwen rounds routing weights to the model dtype
def test_fused_moe_matches_per_token_computation(dtype: str, tokens: int, top_k: int, fp32_weights: bool) -> None:
    torch.manual_seed(tokens * 10 + top_k)
    dtype_ = dtype_from_name(dtype)
    x = torch.randn(tokens, HIDDEN, dtype=dtype_)
    topk_weights, topk_ids = _route(tokens, top_k, torch.float32 if fp32_weights else dtype_)
    w13, w2 = _weights(dtype_)
    out = ops.fused_moe(x, topk_weights, topk_ids, w13, w2)
    assert out.dtype == dtype_ and out.shape == x.shape
    torch.testing.assert_close(out, per_token(x, topk_weights, topk_ids, w13, w2), **TOLERANCES[dtype_])


def test_experts_without_tokens_and_uneven_loads() -> None:
    """Every token picks expert 4 and one of 0/1; experts 2, 3 and 5 get nothing."""
    torch.manual_seed(0)
    x, w13, w2 = torch.randn(9, HIDDEN), *_weights(torch.float32)
    topk_ids = torch.stack([torch.full((9,), 4), torch.arange(9) % 3 // 2], dim=1)  # 2/3 to expert 0, 1/3 to 1
    topk_weights = torch.rand(9, 2)
    out = ops.fused_moe(x, topk_weights, topk_ids, w13, w2)
    torch.testing.assert_close(out, per_token(x, topk_weights, topk_ids, w13, w2), **TOLERANCES[torch.float32])
