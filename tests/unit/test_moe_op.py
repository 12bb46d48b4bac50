"""fused_moe (torch_ref) against a direct per-token transcription of Qwen3-MoE's routing and experts,
and against transformers' own Qwen3MoeSparseMoeBlock."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from rapid_llm import ops
from rapid_llm.config.dtypes import dtype_from_name

HIDDEN, INTERMEDIATE, EXPERTS = 32, 24, 6
TOLERANCES = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


def _weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, dtype=dtype) * 0.2,
            torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, dtype=dtype) * 0.2)


def per_token(x: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
              renormalize: bool) -> torch.Tensor:
    """One token at a time: softmax in fp32, top-k, renormalise, weights cast back, experts summed by id."""
    rows = []
    for token, token_logits in zip(x, logits):
        weights, experts = torch.softmax(token_logits.float(), dim=-1).topk(top_k)
        if renormalize:
            weights = weights / weights.sum()
        weights = weights.to(logits.dtype)
        row = torch.zeros_like(token)
        for weight, expert in sorted(zip(weights, experts.tolist()), key=lambda pair: pair[1]):
            gate, up = F.linear(token, w13[expert]).chunk(2)
            row = row + F.linear(F.silu(gate) * up, w2[expert]) * weight
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize(("top_k", "renormalize"), [(2, True), (2, False), (3, True), (1, False)])
def test_fused_moe_matches_per_token_computation(dtype: str, tokens: int, top_k: int, renormalize: bool) -> None:
    torch.manual_seed(tokens * 10 + top_k)
    dtype_ = dtype_from_name(dtype)
    x, logits = torch.randn(tokens, HIDDEN, dtype=dtype_), torch.randn(tokens, EXPERTS, dtype=dtype_)
    w13, w2 = _weights(dtype_)
    out = ops.fused_moe(x, logits, w13, w2, top_k, renormalize)
    assert out.dtype == dtype_ and out.shape == x.shape
    torch.testing.assert_close(out, per_token(x, logits, w13, w2, top_k, renormalize), **TOLERANCES[dtype_])


def test_experts_without_tokens_and_uneven_loads() -> None:
    """Every token picks expert 4 and one of 0/1; experts 2, 3 and 5 get nothing."""
    torch.manual_seed(0)
    x, w13, w2 = torch.randn(9, HIDDEN), *_weights(torch.float32)
    logits = torch.full((9, EXPERTS), -10.0)
    logits[:, 4] = 5.0
    logits[torch.arange(9), torch.arange(9) % 3 // 2] = 4.0  # two thirds to expert 0, one third to expert 1
    out = ops.fused_moe(x, logits, w13, w2, 2, True)
    torch.testing.assert_close(out, per_token(x, logits, w13, w2, 2, True), **TOLERANCES[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_moe_matches_transformers_sparse_moe_block(dtype: torch.dtype) -> None:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = transformers.Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE,
                                         num_experts=EXPERTS, num_experts_per_tok=2, norm_topk_prob=True)
    config._experts_implementation = "eager"  # the per-expert loop this op transcribes
    torch.manual_seed(2)
    block = Qwen3MoeSparseMoeBlock(config).to(dtype)
    w13, w2 = _weights(dtype)
    with torch.no_grad():
        block.gate.weight.normal_()
        block.experts.gate_up_proj.copy_(w13)
        block.experts.down_proj.copy_(w2)
        x = torch.randn(1, 17, HIDDEN, dtype=dtype)
        expected = block(x)[0]
        out = ops.fused_moe(x[0], F.linear(x[0], block.gate.weight), w13, w2, 2, True)
    # Not bit-exact: the GEMMs see the tokens in another row order.
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
