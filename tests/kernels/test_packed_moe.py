"""The packed fused_moe kernels (`cpu_amx`, `cpu_avx512`) against the torch reference in bf16: uneven expert
loads, experts without tokens, one token, top-k 1 to 4, fp32 (Mixtral) and bf16 (Qwen) routing weights,
swiglu_limit; the C++ loop bit for bit against the Python loop over the same packed GEMMs (same rounding
points); the fallback for widths that are not multiples of 32; idempotent packing;
FusedExperts.prepare_weights. Each kernel skips where the CPU or OS does not run its code (AMX-BF16,
AVX512-BF16)."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.ops.amx_linear import amx_missing
from rapid_llm.ops.amx_moe import AMX_MOE, AVX512_MOE, PackedMoE
from rapid_llm.ops.avx512_linear import avx512_missing
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.moe import TORCH_MOE, expert_loop, fused_moe
from rapid_llm.ops.registry import REGISTRY

AMX_MISSING, AVX512_MISSING = amx_missing("cpu", "bfloat16"), avx512_missing("cpu", "bfloat16")
KERNELS = [pytest.param(AMX_MOE, id="cpu_amx", marks=pytest.mark.skipif(AMX_MISSING is not None,
                                                                       reason=f"cpu_amx: {AMX_MISSING}")),
           pytest.param(AVX512_MOE, id="cpu_avx512", marks=pytest.mark.skipif(
               AVX512_MISSING is not None, reason=f"cpu_avx512: {AVX512_MISSING}"))]


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest) -> PackedMoE:
    return request.param

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
def test_matches_the_reference(kernel: PackedMoE, tokens: int, top_k: int, used_experts: int,
                               weights_dtype: torch.dtype) -> None:
    w13, w2 = _weights(64, 96, seed=tokens)
    topk_weights, topk_ids = _routing(tokens, top_k, used_experts, weights_dtype, seed=tokens + top_k)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(7)).bfloat16()
    packed = kernel.prepare(w13, w2)
    assert packed[0].shape == (EXPERTS, 2 * 96 // 16, 64 // 2, 32)
    assert packed[1].shape == (EXPERTS, 64 // 16, 96 // 2, 32)
    got = kernel(x, topk_weights, topk_ids, *packed)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    torch.testing.assert_close(got, fused_moe(x, topk_weights, topk_ids, w13, w2), **TOLERANCE)


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16], ids=["fp32-weights", "bf16-weights"])
@pytest.mark.parametrize(("tokens", "top_k", "used_experts"), [(1, 2, 8), (7, 3, 4), (50, 2, 8)])
def test_the_cpp_loop_rounds_where_the_python_loop_does(kernel: PackedMoE, tokens: int, top_k: int, used_experts: int,
                                                        weights_dtype: torch.dtype) -> None:
    w13, w2 = kernel.prepare(*_weights(64, 64, seed=tokens))
    topk_weights, topk_ids = _routing(tokens, top_k, used_experts, weights_dtype, seed=tokens)
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(11)).bfloat16()
    python_loop = expert_loop(x, topk_weights, topk_ids, w13, w2, None, kernel.linear)
    assert torch.equal(kernel(x, topk_weights, topk_ids, w13, w2), python_loop)
    wide = torch.cat([x, x], dim=1)[:, :64]  # a strided view: the kernel takes a contiguous copy
    assert torch.equal(kernel(wide, topk_weights, topk_ids, w13, w2), python_loop)


def test_the_cpp_loop_rejects_bad_arguments(kernel: PackedMoE) -> None:
    w13, w2 = kernel.prepare(*_weights(64, 32, seed=10))
    x, weights, ids = torch.randn(3, 64).bfloat16(), torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int64)
    call = CPU_OPS.load().packed_fused_moe
    amx = kernel is AMX_MOE
    with pytest.raises(RuntimeError, match="outside"):
        call(x, weights, ids + EXPERTS, w13, w2, amx)
    with pytest.raises(RuntimeError, match="must both be"):
        call(x, weights[:, :1], ids, w13, w2, amx)
    with pytest.raises(RuntimeError, match="stacked"):
        call(x, weights, ids, w13[0], w2, amx)


def test_swiglu_limit_matches_the_reference(kernel: PackedMoE) -> None:
    w13, w2 = _weights(64, 32, seed=1)
    topk_weights, topk_ids = _routing(9, 2, 8, torch.float32, seed=2)
    x = (torch.randn(9, 64, generator=torch.Generator().manual_seed(3)) * 8).bfloat16()  # past the limit
    got = kernel(x, topk_weights, topk_ids, *kernel.prepare(w13, w2), 1.5)
    torch.testing.assert_close(got, fused_moe(x, topk_weights, topk_ids, w13, w2, 1.5), **TOLERANCE)


@pytest.mark.parametrize(("hidden", "intermediate"), [(64, 24), (40, 32)])
def test_unaligned_widths_keep_the_checkpoint_layout_and_the_reference(kernel: PackedMoE, hidden: int,
                                                                      intermediate: int) -> None:
    w13, w2 = _weights(hidden, intermediate, seed=4)
    prepared = kernel.prepare(w13, w2)
    assert prepared[0] is w13 and prepared[1] is w2
    topk_weights, topk_ids = _routing(6, 2, 8, torch.float32, seed=5)
    x = torch.randn(6, hidden).bfloat16()
    assert torch.equal(kernel(x, topk_weights, topk_ids, *prepared), fused_moe(x, topk_weights, topk_ids, w13, w2))


def test_prepare_is_idempotent(kernel: PackedMoE) -> None:
    packed = kernel.prepare(*_weights(64, 32, seed=6))
    again = kernel.prepare(*packed)
    assert again[0] is packed[0] and again[1] is packed[1]


@pytest.mark.skipif(AMX_MISSING is not None and AVX512_MISSING is not None,
                    reason=f"cpu_amx: {AMX_MISSING}; cpu_avx512: {AVX512_MISSING}")
def test_fused_experts_prepare_selects_a_packed_kernel_and_packs_once() -> None:
    selected = AMX_MOE if AMX_MISSING is None else AVX512_MOE  # cpu_amx first where both run
    assert REGISTRY.select("fused_moe", "cpu", torch.bfloat16).fn is selected
    experts = FusedExperts(EXPERTS, 64, 32).bfloat16()
    experts.w13_weight.data, experts.w2_weight.data = _weights(64, 32, seed=8)
    topk_weights, topk_ids = _routing(4, 2, 8, torch.float32, seed=9)
    x = torch.randn(4, 64).bfloat16()
    unprepared = experts(x, topk_weights, topk_ids)
    assert experts.kernel is TORCH_MOE
    experts.prepare_weights()
    assert experts.kernel is selected and experts.w13_weight.dim() == 4
    packed = experts.w13_weight
    experts.prepare_weights()  # a second call keeps the packed weights
    assert experts.w13_weight is packed
    torch.testing.assert_close(experts(x, topk_weights, topk_ids), unprepared, **TOLERANCE)
