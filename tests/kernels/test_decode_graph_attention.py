"""The Triton backend over CUDA-graph static decode buffers (`graph_decode_metadata` on `DecodeBuffers`) equals
the torch reference over the same step, and the bucket's padded rows write only the padding block.

The split count and length are fixed for max_model_len at capture, so a graph's decodes of any shorter
length run over empty splits too; this checks that they merge exactly. On CPU under Triton's interpreter
(tests/kernels/conftest.py); `-m gpu` on CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it is a Linux-only dependency)")

from rapid_llm.ops.attention import StepLayout  # noqa: E402
from rapid_llm.ops.attention.backend import build_common_metadata  # noqa: E402
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND  # noqa: E402
from rapid_llm.ops.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from rapid_llm.worker_proc.cuda_graphs import DecodeBuffers  # noqa: E402

BLOCK_SIZE, NUM_BLOCKS, HEADS, KV_HEADS, HEAD_DIM, SCALE = 4, 40, 4, 2, 16, 0.25
PADDING_BLOCK = NUM_BLOCKS - 1
MAX_MODEL_LEN = 96


@pytest.mark.parametrize("seq_lens", [[9, 1, 40], [1], [33, 2, 7, 16, 5]])
def test_static_decode_metadata_matches_the_reference_and_padding_stays_in_its_block(
        triton_device: torch.device, seq_lens: list[int]) -> None:
    torch.manual_seed(len(seq_lens))
    free = torch.randperm(PADDING_BLOCK).tolist()
    tables = [[free.pop() for _ in range(-(-n // BLOCK_SIZE))] for n in seq_lens]
    width = max(len(row) for row in tables)
    table = torch.tensor([row + [PADDING_BLOCK] * (width - len(row)) for row in tables], device=triton_device)
    layout = StepLayout([1] * len(seq_lens), seq_lens, tables, BLOCK_SIZE, block_table=table)
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=triton_device)
    num_seqs, bucket = len(seq_lens), 8
    query = torch.randn(bucket, HEADS, HEAD_DIM, device=triton_device)
    key, value = (torch.randn(bucket, KV_HEADS, HEAD_DIM, device=triton_device) for _ in range(2))

    expected_cache = cache.clone()
    expected = TORCH_REF_BACKEND.forward(query[:num_seqs], key[:num_seqs], value[:num_seqs], expected_cache,
                                         TORCH_REF_BACKEND.build_metadata(layout, triton_device), SCALE, None)

    backend = TritonAttentionBackend(min_split_len=8, max_splits=4)
    buffers = DecodeBuffers.allocate(bucket, -(-MAX_MODEL_LEN // BLOCK_SIZE), PADDING_BLOCK, BLOCK_SIZE, triton_device)
    buffers.fill(bucket, torch.zeros(num_seqs, dtype=torch.int64, device=triton_device),
                 build_common_metadata(layout, triton_device))
    metadata = backend.graph_decode_metadata(buffers.view(bucket), MAX_MODEL_LEN)
    assert metadata.num_kv_splits * metadata.kv_split_len >= MAX_MODEL_LEN
    output = backend.forward(query, key, value, cache, metadata, SCALE, None)

    torch.testing.assert_close(output[:num_seqs].cpu(), expected.cpu(), atol=1e-5, rtol=1e-5)
    assert torch.equal(cache[:, :PADDING_BLOCK], expected_cache[:, :PADDING_BLOCK])  # live blocks: the step's K/V only
    assert torch.isfinite(output[num_seqs:]).all()
