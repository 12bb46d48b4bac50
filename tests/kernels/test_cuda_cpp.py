"""The cuda_cpp silu_and_mul (JIT-built CUDA extension) against torch_ref on a CUDA device; on a machine
without one it is skipped by the registry with a reason, and nothing is compiled."""

from __future__ import annotations

import pytest
import torch

from rapid_llm import ops
from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.ops.activation import silu_and_mul as reference
from rapid_llm.ops.cpp import cuda_activation
from rapid_llm.ops.registry import REGISTRY, NoImplementationError
from tests.op_pins import pinned_backends


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_skipped_without_a_cuda_device_and_not_compiled() -> None:
    with pytest.raises(NoImplementationError, match="cuda_cpp .*needs device cuda, the call is on cpu"):
        REGISTRY.implementation("silu_and_mul", "cuda_cpp", "cpu", "bf16")
    assert cuda_activation.skip_reason("cuda", "float32") is not None
    assert not cuda_activation.CUDA_OPS.build_directory().exists()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 7, 33])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_matches_torch_ref_on_cuda(dtype: str, tokens: int) -> None:
    assert cuda_activation.skip_reason("cuda", "float32") is None
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 2 * 40, dtype=dtype_from_name(dtype), device="cuda")
    # Triton's kernel ranks above it (priority 20 vs 10); --op-backend silu_and_mul=cuda_cpp selects it.
    assert REGISTRY.select("silu_and_mul", x.device, x.dtype).backend == "triton"
    with pinned_backends({"silu_and_mul": "cuda_cpp"}):
        assert REGISTRY.select("silu_and_mul", x.device, x.dtype).backend == "cuda_cpp"
        torch.testing.assert_close(ops.silu_and_mul(x), reference(x))
    strided = x.view(1, tokens, 80)[:, :, :60]  # 3-D, non-contiguous rows
    torch.testing.assert_close(cuda_activation.silu_and_mul(strided), reference(strided))
