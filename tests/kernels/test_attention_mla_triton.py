"""The Triton MLA backend (and the FlashMLA adapter over a stand-in module) against naive MLA and torch_ref.

Batches mix decodes, fresh prefills and chunks after cached context with lengths unaligned to the block size
(3), a prefill of more rows than one tile and contexts longer than one key tile, through
tests/kernels/test_attention_mla.py's two-step setup. On CPU the kernel runs under Triton's interpreter
(tests/kernels/conftest.py); `-m gpu` on CUDA. The FlashMLA stand-in computes the documented semantics of
`flash_mla_with_kvcache` in torch and checks the dtypes and shapes the adapter passes.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.ops.attention import MLADims, StepLayout  # noqa: E402
from rapid_llm.ops.attention.mla_torch_ref import MLA_TORCH_REF_BACKEND  # noqa: E402
from rapid_llm.ops.attention.mla_triton import TRITON_MLA_BACKEND  # noqa: E402
from tests.kernels import test_attention_mla as mla  # noqa: E402

MIXED = [(9, 1), (0, 13), (5, 4), (40, 1), (0, 1), (20, 6)]  # 13 tokens x 3 heads: more rows than a tile
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 5e-2}  # as torch_ref / torch_absorbed meet in test_attention_mla


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shapes", [MIXED, [(4, 1), (7, 1), (33, 1)], [(0, 1)], [(0, 5)], [(6, 9), (0, 2)]],
                         ids=["mixed", "decodes", "one-token", "prefill", "chunks"])
def test_matches_naive_mla_and_torch_ref(triton_device: torch.device, shapes: list[tuple[int, int]],
                                         dtype: torch.dtype) -> None:
    torch.manual_seed(len(shapes))
    output, expected, cache = mla._run(TRITON_MLA_BACKEND, shapes, dtype, triton_device)
    torch.manual_seed(len(shapes))  # the same inputs through the reference backend
    reference, _, reference_cache = mla._run(MLA_TORCH_REF_BACKEND, shapes, dtype)
    assert output.dtype == dtype and output.shape == reference.shape
    assert torch.equal(cache, reference_cache)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(output.float(), expected.float(), atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(output.float(), reference.float(), atol=tolerance, rtol=tolerance)


FLASH_DIMS = MLADims(kv_lora_rank=512, qk_nope_head_dim=8, qk_rope_head_dim=64, v_head_dim=8)


def _flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                            cache_seqlens: torch.Tensor, head_dim_v: int, tile_scheduler_metadata: Any,
                            num_splits: Any, softmax_scale: float | None = None,
                            causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's dense decode as its docstring defines it, with the checks its C++ entry point makes."""
    assert (tile_scheduler_metadata, num_splits) == ("schedule", "splits")
    assert block_table.dtype == cache_seqlens.dtype == torch.int32 and q.dtype == k_cache.dtype
    assert k_cache.shape[1:] == (64, 1, 576) and head_dim_v == 512 and q.shape[1] == 1 and q.shape[3] == 576
    assert q.stride(-1) == k_cache.stride(-1) == block_table.stride(-1) == 1 and not causal
    outputs = []
    for seq in range(q.shape[0]):
        keys = k_cache[block_table[seq].long()].flatten(0, 1)[: int(cache_seqlens[seq]), 0].float()
        probs = (q[seq, 0].float() @ keys.T * softmax_scale).softmax(dim=-1)
        outputs.append(probs @ keys[:, :head_dim_v])
    return torch.stack(outputs).unsqueeze(1).to(q.dtype), torch.empty(0)


@pytest.fixture
def flash_mla(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The adapter, importing a stand-in `flash_mla` that records its scheduling calls."""
    stand_in = types.ModuleType("flash_mla")
    stand_in.calls = []
    stand_in.get_mla_metadata = lambda *args: stand_in.calls.append(args) or ("schedule", "splits")
    stand_in.flash_mla_with_kvcache = _flash_mla_with_kvcache
    monkeypatch.setitem(sys.modules, "flash_mla", stand_in)
    monkeypatch.delitem(sys.modules, "rapid_llm.ops.attention.flash_mla", raising=False)
    import rapid_llm.ops.attention.flash_mla as adapter

    yield adapter
    sys.modules.pop("rapid_llm.ops.attention.flash_mla", None)


# fp32 checks the plumbing tightly (the stand-in computes in fp32); bf16 outputs here are ~14 on average, where
# one bf16 step is 0.06-0.25 and the 512-wide absorbed dots round twice (torch_absorbed's decodes: 0.19 off).
@pytest.mark.parametrize(("dtype", "atol", "rtol"), [(torch.float32, 1e-4, 1e-5), (torch.bfloat16, 0.5, 2e-2)],
                         ids=["fp32", "bf16"])
def test_flash_mla_sends_decodes_to_the_library(triton_device: torch.device, flash_mla: types.ModuleType,
                                                monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, atol: float,
                                                rtol: float) -> None:
    monkeypatch.setattr(mla, "DIMS", FLASH_DIMS)
    monkeypatch.setattr(mla, "BLOCK_SIZE", 64)
    monkeypatch.setattr(mla, "HEADS", 2)
    monkeypatch.setattr(mla, "SCALE", FLASH_DIMS.qk_head_dim**-0.5)  # a model's scale: a softmax not one-hot
    torch.manual_seed(5)
    shapes = [(70, 1), (0, 3), (5, 1), (64, 2)]  # decodes over 2 blocks and 1; chunks on the Triton kernel
    output, expected, _ = mla._run(flash_mla.FLASH_MLA_BACKEND, shapes, dtype, triton_device)
    torch.testing.assert_close(output.float(), expected.float(), atol=atol, rtol=rtol)
    (seq_lens, heads_per_kv_head, kv_heads), = sys.modules["flash_mla"].calls  # the context step had no decodes
    assert seq_lens.tolist() == [71, 6] and seq_lens.dtype == torch.int32 and (heads_per_kv_head, kv_heads) == (2, 1)


def test_flash_mla_refuses_other_block_sizes_and_widths(flash_mla: types.ModuleType) -> None:
    backend = flash_mla.FLASH_MLA_BACKEND
    with pytest.raises(ValueError, match="needs KV block size 64 .*--block-size 64.*got 16"):
        backend.build_metadata(StepLayout([1], [5], [[0]], 16), torch.device("cpu"))
    metadata = backend.build_metadata(StepLayout([1], [5], [[0]], 64), torch.device("cpu"))
    with pytest.raises(ValueError, match="kv_lora_rank 512 and qk_rope_head_dim 64, got 12 and 4"):
        backend.attend(torch.zeros(1, 2, 12), torch.zeros(1, 2, 4), torch.zeros(1, 64, 16), torch.zeros(1, 2, 12),
                       metadata, 1.0)


def test_flash_mla_schedules_once_per_step(flash_mla: types.ModuleType) -> None:
    backend, cpu = flash_mla.FLASH_MLA_BACKEND, torch.device("cpu")
    metadata = backend.build_metadata(StepLayout([1, 1], [3, 70], [[0], [1, 2]], 64), cpu)
    assert metadata.decode_block_tables.tolist() == [[0, 0], [1, 2]] and not metadata.kernel_seq_ids.numel()
    cache = torch.randn(3, 64, FLASH_DIMS.latent_dim)
    kv_b_weight = torch.randn(2 * (FLASH_DIMS.qk_nope_head_dim + FLASH_DIMS.v_head_dim), FLASH_DIMS.kv_lora_rank)
    for _ in range(2):  # two layers of one step
        backend.forward(torch.randn(2, 2, FLASH_DIMS.qk_head_dim), torch.randn(2, FLASH_DIMS.latent_dim), cache,
                        kv_b_weight, FLASH_DIMS, metadata, 0.1)
    assert len(sys.modules["flash_mla"].calls) == 1
