"""The cpu_paged attention backend (C++ extension) matches naive attention and the torch reference."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.ops.attention import cpu_paged
from rapid_llm.ops.attention.cpu_paged import CPU_PAGED_BACKEND, CpuPagedBackend
from rapid_llm.ops.cpp.cpu_ops import skip_reason
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND
from tests.kernels.attention_cases import run_mixed_batch

UNAVAILABLE = skip_reason("cpu", "float32")
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))
TOLERANCES = {"fp32": 2e-5, "bf16": 1e-2, "fp16": 2e-3}
# (context already cached, new tokens) per sequence.
CASES = {
    "one_token": [(0, 1)],
    "mixed": [(9, 1), (0, 7), (5, 4), (12, 1)],
    "unaligned": [(17, 1), (0, 33), (31, 2), (1, 15)],
    "long_decodes_split": [(1999, 1), (700, 1)],
    "long_chunk_after_context": [(600, 40)],
}


@pytest.fixture(params=["hybrid", "kernel_only"])
def kernel_query_len(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """hybrid: long chunks go to SDPA as in serving; kernel_only: the C++ kernel computes every row."""
    if request.param == "kernel_only":
        monkeypatch.setattr(cpu_paged, "MAX_KERNEL_QUERY_LEN", 1 << 30)
        monkeypatch.setattr(cpu_paged, "MAX_BF16_KERNEL_QUERY_LEN", 1 << 30)


class _StridedQuery(CpuPagedBackend):
    """Queries come as a view of the fused qkv projection: rows are strided, heads contiguous."""

    def forward(self, query, key, value, kv_cache, metadata, scale, sliding_window):  # type: ignore[no-untyped-def]
        fused = torch.cat([query.flatten(1), key.flatten(1), value.flatten(1)], dim=1)
        strided = fused[:, : query[0].numel()].view(query.shape)
        assert not strided.is_contiguous()
        return super().forward(strided, key, value, kv_cache, metadata, scale, sliding_window)


@pytest.mark.usefixtures("kernel_query_len")
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "window"), [(4, 2, 8, None), (8, 1, 64, None),
                                                                      (4, 4, 32, 5), (6, 2, 16, 300)])
def test_matches_naive_and_torch_ref(case: str, dtype: str, heads: int, kv_heads: int, head_dim: int,
                                     window: int | None) -> None:
    shapes, torch_dtype, block_size = CASES[case], dtype_from_name(dtype), 16 if head_dim > 8 else 3
    outputs = []
    for backend in (CPU_PAGED_BACKEND, TORCH_REF_BACKEND):
        torch.manual_seed(0)  # both backends see the same inputs
        outputs.append(run_mixed_batch(backend, shapes, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                       block_size=block_size, dtype=torch_dtype, window=window))
    (output, naive), (reference, _) = outputs
    tolerance = TOLERANCES[dtype]
    assert output.dtype == torch_dtype and output.shape == reference.shape
    torch.testing.assert_close(output.float(), naive, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(output.float(), reference.float(), atol=2 * tolerance, rtol=2 * tolerance)


@pytest.mark.parametrize("threads", [1, 2])
def test_split_count_does_not_change_the_result(threads: int) -> None:
    """One long decode is split along its keys (more splits with more threads); the merge is exact."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(1)
        output, naive = run_mixed_batch(CPU_PAGED_BACKEND, [(4000, 1)], heads=2, kv_heads=1, head_dim=32,
                                        block_size=16)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(output, naive, atol=2e-5, rtol=2e-5)


@pytest.mark.usefixtures("kernel_query_len")
def test_strided_query_rows() -> None:
    torch.manual_seed(2)
    output, naive = run_mixed_batch(_StridedQuery(), [(5, 3), (20, 1)], heads=4, kv_heads=2, head_dim=16,
                                    block_size=16)
    torch.testing.assert_close(output, naive, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 64), (torch.bfloat16, 48), (torch.float32, 64)])
def test_chunks_up_to_the_dtypes_limit_take_the_kernel(dtype: torch.dtype, head_dim: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The paged kernel computes every chunk of at most `kernel_query_limit` new tokens (16 with the AVX-512
    BF16 kernel, 4 otherwise); longer ones go to the tiled prefill kernel (bf16, its head dims, AVX-512 BF16)
    or else to padded SDPA; each stays exact."""
    padded_seqs = []
    real = cpu_paged.attend_padded_group

    def spy(output, query, kv_cache, group, *args):  # type: ignore[no-untyped-def]
        padded_seqs.append(group.num_seqs)
        real(output, query, kv_cache, group, *args)

    monkeypatch.setattr(cpu_paged, "attend_padded_group", spy)
    fast = dtype == torch.bfloat16 and head_dim == 64 and cpu_paged.CPU_OPS.load().paged_attention_bf16_kernel()
    tiled = dtype == torch.bfloat16 and head_dim in cpu_paged.CPU_OPS.load().prefill_attention_head_dims()
    limit = cpu_paged.MAX_BF16_KERNEL_QUERY_LEN if fast else cpu_paged.MAX_KERNEL_QUERY_LEN
    torch.manual_seed(4)
    shapes = [(40, 1), (30, 4), (20, 5), (25, 16), (10, 17)]
    output, naive = run_mixed_batch(CPU_PAGED_BACKEND, shapes, heads=6, kv_heads=2, head_dim=head_dim,
                                    block_size=16, dtype=dtype)
    tolerance = TOLERANCES["bf16" if dtype == torch.bfloat16 else "fp32"]
    torch.testing.assert_close(output.float(), naive, atol=tolerance, rtol=tolerance)
    if tiled:
        assert padded_seqs == []
    else:  # run_mixed_batch's first call fills the context (one prefill group); the second is the step.
        assert padded_seqs[-1] == sum(new > limit for _, new in shapes)


@pytest.mark.usefixtures("kernel_query_len")
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(8, 2, 128), (3, 3, 32), (8, 1, 256)])
def test_bf16_head_dims_and_block_sizes(block_size: int, heads: int, kv_heads: int, head_dim: int) -> None:
    """bf16 with head_dim a multiple of 32 takes the AVX-512 BF16 kernel where the CPU has it: runs of 16
    keys that end inside a block (32), at its end (16) or are cut short by it (8), odd groups included."""
    torch.manual_seed(3)
    shapes = CASES["unaligned"] + CASES["long_decodes_split"]
    output, naive = run_mixed_batch(CPU_PAGED_BACKEND, shapes, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                    block_size=block_size, dtype=torch.bfloat16)
    torch.testing.assert_close(output.float(), naive, atol=TOLERANCES["bf16"], rtol=TOLERANCES["bf16"])


@pytest.mark.usefixtures("kernel_query_len")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [32, 64])
def test_unwritten_cache_slots_never_reach_the_output(dtype: str, head_dim: int) -> None:
    """Slots past a sequence's last key hold NaN: kernels that read keys in pairs or runs (the bf16 P.V takes
    two value rows per instruction) must leave the row after an odd run's last key out, not multiply it by 0."""
    torch.manual_seed(4)
    shapes = [(16, 1), (0, 17), (30, 3), (1, 2)]
    output, naive = run_mixed_batch(CPU_PAGED_BACKEND, shapes, heads=4, kv_heads=2, head_dim=head_dim,
                                    block_size=16, dtype=dtype_from_name(dtype), unwritten=float("nan"))
    assert not output.isnan().any()
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(output.float(), naive, atol=tolerance, rtol=tolerance)
