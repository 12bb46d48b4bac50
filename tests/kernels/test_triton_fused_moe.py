"""The Triton fused_moe (grouped GEMM over expert-sorted slots) against the torch reference, and its slot alignment.

Shapes are small and unaligned (hidden 40, intermediate 24: partial K and N tiles). Tolerances: fp32 1e-5 (the
GEMMs sum in another order); fp16 2e-3, about two steps (the kernels round where the reference does; a different
summation order can flip a rounding); bf16 3e-2, about four steps at 1, because Triton's interpreter rounds
fp32 -> bf16 by truncation, a bias that the second GEMM and the top-k sum carry on. So the bf16 path is also
checked bit for bit on CPU against a transcription that truncates where the kernels round, which pins the
rounding points and the summation order.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.config.dtypes import dtype_from_name  # noqa: E402
from rapid_llm.ops import moe  # noqa: E402
from rapid_llm.ops.registry import REGISTRY  # noqa: E402
from rapid_llm.ops.triton import fused_moe as triton_moe  # noqa: E402
from rapid_llm.ops.triton.moe_align import align_slots  # noqa: E402
from tests.kernels.triton_interpreter import INTERPRETED, INTERPRETER_FAULT  # noqa: E402

HIDDEN, INTERMEDIATE, EXPERTS = 40, 24, 6


TOLERANCES = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float16: {"atol": 2e-3, "rtol": 2e-3},
              torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


def _weights(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device=device).mul(HIDDEN**-0.5).to(dtype),
            torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, device=device).mul(INTERMEDIATE**-0.5).to(dtype))


def _check(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
           w2: torch.Tensor, swiglu_limit: float | None = None) -> None:
    out = triton_moe.fused_moe(x, topk_weights, topk_ids, w13, w2, swiglu_limit)
    assert out.dtype == x.dtype and out.shape == x.shape
    torch.testing.assert_close(out, moe.fused_moe(x, topk_weights, topk_ids, w13, w2, swiglu_limit),
                               **TOLERANCES[x.dtype])


@pytest.mark.parametrize("fp32_weights", [False, True])  # Qwen rounds routing weights to the model dtype
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("tokens", [1, 7, 33])  # one token; 33: experts with unaligned slot counts
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_matches_the_reference(triton_device: torch.device, dtype: str, tokens: int, top_k: int,
                               fp32_weights: bool) -> None:
    torch.manual_seed(tokens * 10 + top_k)
    dtype_ = dtype_from_name(dtype)
    x = torch.randn(tokens, HIDDEN, device=triton_device).to(dtype_)
    values, topk_ids = torch.randn(tokens, EXPERTS, device=triton_device).topk(top_k, dim=-1)
    topk_weights = values.softmax(dim=-1).to(torch.float32 if fp32_weights else dtype_)
    _check(x, topk_weights, topk_ids, *_weights(dtype_, triton_device))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_uneven_loads_and_experts_without_tokens(triton_device: torch.device, dtype: str) -> None:
    """Every token picks expert 4 (40 slots: several blocks) and one of 0/1; experts 2, 3 and 5 get nothing.
    The ids are int32, as a hash-routing table may give them."""
    torch.manual_seed(0)
    dtype_ = dtype_from_name(dtype)
    x = torch.randn(40, HIDDEN, device=triton_device).to(dtype_)
    topk_ids = torch.stack([torch.full((40,), 4), torch.arange(40) % 3 // 2], dim=1).to(triton_device, torch.int32)
    _check(x, torch.rand(40, 2, device=triton_device), topk_ids, *_weights(dtype_, triton_device))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_swiglu_limit_clamps_as_the_reference_does(triton_device: torch.device, dtype: str) -> None:
    """DeepSeek-V4's clamp of gate and up before the activation; a limit of 0.5 clamps most values here."""
    torch.manual_seed(3)
    dtype_ = dtype_from_name(dtype)
    x = torch.randn(9, HIDDEN, device=triton_device).mul(4).to(dtype_)
    values, topk_ids = torch.randn(9, EXPERTS, device=triton_device).topk(2, dim=-1)
    _check(x, values.softmax(dim=-1), topk_ids, *_weights(dtype_, triton_device), swiglu_limit=0.5)


def test_every_expert_for_every_token(triton_device: torch.device) -> None:
    """70 slots per expert: blocks of 64 rows, two per expert."""
    torch.manual_seed(1)
    x = torch.randn(70, HIDDEN, device=triton_device)
    topk_ids = torch.stack([torch.randperm(EXPERTS) for _ in range(70)]).to(triton_device)
    _check(x, torch.rand(70, EXPERTS, device=triton_device), topk_ids, *_weights(torch.float32, triton_device))


def _truncated(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 rounded toward zero, as Triton's interpreter converts."""
    return (x.float().contiguous().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)


def _truncating_transcription(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                              w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The reference per token, truncating where the kernels round (silu_and_mul is the torch op's)."""
    rows = []
    for token, weights, experts in zip(x.float(), topk_weights.float(), topk_ids.tolist()):
        row = torch.zeros_like(token)
        for weight, expert in sorted(zip(weights, experts), key=lambda pair: pair[1]):
            gate, up = _truncated(token @ w13[expert].float().T).chunk(2)
            down = _truncated((F.silu(gate) * up).float() @ w2[expert].float().T)
            row = _truncated(row + _truncated(down.float() * weight).float()).float()
        rows.append(row)
    return torch.stack(rows).to(torch.bfloat16)


@pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter's bf16 rounding")
@pytest.mark.skipif(INTERPRETER_FAULT is not None, reason=str(INTERPRETER_FAULT))
@pytest.mark.parametrize(("tokens", "top_k"), [(7, 2), (20, 6)])
def test_bf16_rounds_where_the_reference_does(tokens: int, top_k: int) -> None:
    torch.manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
    values, topk_ids = torch.randn(tokens, EXPERTS).topk(top_k, dim=-1)
    args = (x, values.softmax(dim=-1), topk_ids, *_weights(torch.bfloat16, torch.device("cpu")))
    assert torch.equal(triton_moe.fused_moe(*args), _truncating_transcription(*args))


def test_slots_are_sorted_by_expert_in_whole_blocks() -> None:
    topk_ids = torch.tensor([[4, 0], [4, 1], [0, 4], [4, 0]])
    sorted_slots, block_experts = align_slots(topk_ids, EXPERTS, 4)
    rows = sorted_slots.view(-1, 4)
    assert block_experts.tolist()[:3] == [0, 1, 4]  # experts 0 (3 slots), 1 (1), 4 (4): one block each
    assert rows[:3].tolist() == [[1, 4, 7, 8], [3, 8, 8, 8], [0, 2, 5, 6]]  # slot order, padded with 8
    assert (block_experts[3:] == EXPERTS).all() and (rows[3:] == 8).all()  # worst-case capacity, unused


def test_rejects_mismatched_shapes_and_dtypes() -> None:
    x, (w13, w2) = torch.randn(3, HIDDEN), _weights(torch.float32, torch.device("cpu"))
    ids, weights = torch.zeros(3, 2, dtype=torch.int64), torch.ones(3, 2)
    with pytest.raises(ValueError, match="must both be"):
        triton_moe.fused_moe(x, weights[:, :1], ids, w13, w2)
    with pytest.raises(ValueError, match="w13"):
        triton_moe.fused_moe(x, weights, ids, w13, w2[:, :, :-1])
    with pytest.raises(ValueError, match="dtype"):
        triton_moe.fused_moe(x, weights, ids, w13.to(torch.bfloat16), w2)


def test_registered_for_cuda() -> None:
    assert REGISTRY.implementation("fused_moe", "triton", "cuda", "bfloat16").fn is triton_moe.TRITON_MOE
