"""The `cpu_cpp` kv_cache_store beyond the op-numerics matrix: inputs it does not copy directly (transposed
rows, another dtype) go to the reference and give its result; a slot outside the cache is refused."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.attention.backend import write_kv_cache
from rapid_llm.ops.cpp import cpu_fused
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS

pytestmark = pytest.mark.skipif(CPU_OPS.skip_reason() is not None, reason=f"C++ extension: {CPU_OPS.skip_reason()}")


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "fp32 into bf16"])
def test_equals_the_reference(layout: str) -> None:
    torch.manual_seed(0)
    cache = torch.randn(2, 3, 4, 2, 8).bfloat16()
    slots = torch.tensor([5, 0, 11])
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    if layout == "transposed":
        key, value = torch.randn(2, 3, 8).transpose(0, 1), torch.randn(2, 3, 8).transpose(0, 1)
    if layout != "fp32 into bf16":
        key, value = key.bfloat16(), value.bfloat16()
    expected = cache.clone()
    write_kv_cache(key, value, expected, slots)
    cpu_fused.kv_cache_store(key, value, cache, slots)
    torch.testing.assert_close(cache, expected, rtol=0, atol=0)


def test_a_slot_outside_the_cache_is_refused() -> None:
    cache = torch.zeros(2, 1, 4, 1, 8, dtype=torch.bfloat16)
    rows = torch.zeros(1, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_fused.kv_cache_store(rows, rows, cache, torch.tensor([4]))
