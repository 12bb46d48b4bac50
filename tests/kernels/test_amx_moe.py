"""The `cpu_amx` fused_moe against the torch reference in bf16: uneven expert loads, experts without tokens,
one token, top-k 1 to 4, fp32 (Mixtral) and bf16 (Qwen) routing weights, swiglu_limit; the C++ loop bit for
bit against the Python loop over the same packed GEMMs (same rounding points); the fallback for widths that
are not multiples of 32; idempotent packing; FusedExperts.prepare_weights. Skips where the CPU or OS does
not run AMX-BF16 / AVX512-BF16 code."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.ops.amx_linear import amx_missing
from rapid_llm.ops.amx_moe import AMX_MOE, packed_linear
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.moe import TORCH_MOE, expert_loop, fused_moe
from rapid_llm.ops.registry import REGISTRY

pytestmark = pytest.mark.skipif(amx_missing("cpu", "bfloat16") is not None,
                                reason=f"cpu_amx: {amx_missing('cpu', 'bfloat16')}")

EXPERTS = 8
# bf16 GEMMs summed in another order than oneDNN's: about two roundings at the outputs' scale.
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}


def _weights(hidden: int, intermediate: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    w13 = torch.randn(EXPERTS, 2 * intermediate, hidden, generator=generator) * hidden**-0.5
    w2 = torch.randn(EXPERTS, hidden, intermediate, generator=generator) * intermediate**-0.5
    return w13.bfloat16(), w2.bfloat16()


def _routing(tokens: int, top_k: int, used_experts: int, weights_dtype: torch.dtype,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token among the first `used_experts` (the rest get no tokens), skewed loads."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, used_experts, generator=generator) + torch.linspace(2, 0, used_experts)
    top_logits, topk_ids = logits.topk(top_k, dim=-1)
    return top_logits.softmax(dim=-1).to(weights_dtype), topk_ids


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16], ids=["fp32-weights", "bf16-weights"])
@pytest.mark.parametrize(("tokens", "top_k", "used_experts"), [(1, 1, 8), (1, 2, 8), (5, 2, 3), (8, 4, 8),
                                                                 (40, 2, 5), (130, 2, 8)])
def test_matches_the_reference(tokens: int, top_k: int, used_experts: int, weights_dtype: torch.dtype) -> None:
    w13, w2 = _weights(64, 96, seed=tokens)
    topk_weights, topk_ids = _routing(tokens, top_k, used_experts, weights_dtype, seed=tokens + top_k)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    packed = AMX_MOE.prepare(w13, w2)
    assert packed[0].shape == (EXPERTS, 2 * 96 // 16, 64 // 2, 32) and packed[1].shape == (EXPERTS, 64 // 16, 96 // 2, 32)
    got = AMX_MOE(x, topk_weights, topk_ids, *packed)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    torch.testing.assert_close(got, fused_moe(x, topk_weights, topk_ids, w13, w2), **TOLERANCE)


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16], ids=["fp32-weights", "bf16-weights"])
@pytest.mark.parametrize(("tokens", "top_k", "used_experts"), [(1, 2, 8), (7, 3, 4), (50, 2, 8)])
def test_the_cpp_loop_rounds_where_the_python_loop_does(tokens: int, top_k: int, used_experts: int,
                                                        weights_dtype: torch.dtype) -> None:
    w13, w2 = AMX_MOE.prepare(*_weights(64, 64, seed=tokens))
    topk_weights, topk_ids = _routing(tokens, top_k, used_experts, weights_dtype, seed=tokens)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(11)).bfloat16()
    python_loop = expert_loop(x, topk_weights, topk_ids, w13, w2, None, packed_linear)
    assert torch.equal(AMX_MOE(x, topk_weights, topk_ids, w13, w2), python_loop)
    wide = torch.cat([x, x], dim=1)[:, :64]  # a strided view: the kernel takes a contiguous copy
    assert torch.equal(AMX_MOE(wide, topk_weights, topk_ids, w13, w2), python_loop)


def test_the_cpp_loop_rejects_bad_arguments() -> None:
    w13, w2 = AMX_MOE.prepare(*_weights(64, 32, seed=10))
    x, weights, ids = torch.randn(3, 64).bfloat16(), torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int64)
    kernel = CPU_OPS.load().amx_fused_moe
    with pytest.raises(RuntimeError, match="outside"):
        kernel(x, weights, ids + EXPERTS, w13, w2)
    with pytest.raises(RuntimeError, match="must both be"):
        kernel(x, weights[:, :1], ids, w13, w2)
    with pytest.raises(RuntimeError, match="stacked"):
        kernel(x, weights, ids, w13[0], w2)


def test_swiglu_limit_matches_the_reference() -> None:
    w13, w2 = _weights(64, 32, seed=1)
    topk_weights, topk_ids = _routing(9, 2, 8, torch.float32, seed=2)
    x = (torch.randn(9, 64, generator=torch.Generator().manual_seed(3)) * 8).bfloat16()  # past the limit
    got = AMX_MOE(x, topk_weights, topk_ids, *AMX_MOE.prepare(w13, w2), 1.5)
    torch.testing.assert_close(got, fused_moe(x, topk_weights, topk_ids, w13, w2, 1.5), **TOLERANCE)


@pytest.mark.parametrize(("hidden", "intermediate"), [(64, 24), (40, 32)])
def test_unaligned_widths_keep_the_checkpoint_layout_and_the_reference(hidden: int, intermediate: int) -> None:
    w13, w2 = _weights(hidden, intermediate, seed=4)
    prepared = AMX_MOE.prepare(w13, w2)
    assert prepared[0] is w13 and prepared[1] is w2
    topk_weights, topk_ids = _routing(6, 2, 8, torch.float32, seed=5)
    x = torch.randn(6, hidden).bfloat16()
    assert torch.equal(AMX_MOE(x, topk_weights, topk_ids, *prepared), fused_moe(x, topk_weights, topk_ids, w13, w2))


def test_prepare_is_idempotent() -> None:
    packed = AMX_MOE.prepare(*_weights(64, 32, seed=6))
    again = AMX_MOE.prepare(*packed)
    assert again[0] is packed[0] and again[1] is packed[1]


def test_fused_experts_prepare_selects_cpu_amx_and_packs_once() -> None:
    assert REGISTRY.select("fused_moe", "cpu", torch.bfloat16).fn is AMX_MOE
    experts = FusedExperts(EXPERTS, 64, 32).bfloat16()
    experts.w13_weight.data, experts.w2_weight.data = _weights(64, 32, seed=8)
    topk_weights, topk_ids = _routing(4, 2, 8, torch.float32, seed=9)
    x = torch.randn(4, 64).bfloat16()
    unprepared = experts(x, topk_weights, topk_ids)
    assert experts.kernel is TORCH_MOE
    experts.prepare_weights()
    assert experts.kernel is AMX_MOE and experts.w13_weight.dim() == 4
    packed = experts.w13_weight
    experts.prepare_weights()  # a second call keeps the packed weights
    assert experts.w13_weight is packed
    torch.testing.assert_close(experts(x, topk_weights, topk_ids), unprepared, **TOLERANCE)
