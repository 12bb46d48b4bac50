"""CUDA-graph plumbing that runs anywhere: bucket sizes and selection, static-buffer filling and padding,
and a clear refusal to capture off CUDA. Capture and replay themselves are checked on a GPU
(tests/models/test_cuda_graphs.py, `-m gpu`); the static metadata's attention under Triton's interpreter
in tests/kernels/test_decode_graph_attention.py."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.attention.backend import build_common_metadata
from rapid_llm.ops.attention.torch_ref import TORCH_REF_BACKEND
from rapid_llm.worker_proc.cuda_graphs import DecodeBuffers, DecodeGraphs, bucket_for, capture_sizes

PADDING_BLOCK, BLOCK_SIZE = 9, 4


def test_capture_sizes_are_1_2_4_then_multiples_of_8_up_to_the_largest() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 3 + 32
    with pytest.raises(ValueError, match="at least 1"):
        capture_sizes(0)


@pytest.mark.parametrize(("num_seqs", "bucket"), [(1, 1), (3, 4), (4, 4), (5, 8), (17, 20), (20, 20), (21, None)])
def test_a_batch_takes_the_smallest_bucket_holding_it(num_seqs: int, bucket: int | None) -> None:
    assert bucket_for(num_seqs, capture_sizes(20)) == bucket


def _decode_step(seq_lens: list[int], tables: list[list[int]]) -> tuple[torch.Tensor, object]:
    width = max(len(row) for row in tables)
    # As the worker's input batch gives them: rows padded with the padding block.
    table = torch.tensor([row + [PADDING_BLOCK] * (width - len(row)) for row in tables])
    layout = StepLayout([1] * len(seq_lens), seq_lens, tables, BLOCK_SIZE, block_table=table)
    common = build_common_metadata(layout, torch.device("cpu"))
    return torch.tensor([100 + i for i in range(len(seq_lens))]), common


def test_fill_copies_the_step_and_pads_the_bucket_with_the_padding_block() -> None:
    buffers = DecodeBuffers.allocate(8, 5, PADDING_BLOCK, BLOCK_SIZE, torch.device("cpu"))
    input_ids, common = _decode_step([6, 1, 9], [[3, 4], [7], [0, 1, 2]])
    buffers.fill(4, input_ids, common)
    view = buffers.view(4)
    assert buffers.input_ids[:4].tolist() == [100, 101, 102, 0]
    assert view.positions.tolist() == [5, 0, 8, 0]
    assert view.seq_lens.tolist() == [6, 1, 9, 1]
    assert view.slot_mapping.tolist() == [4 * 4 + 1, 7 * 4, 2 * 4, PADDING_BLOCK * 4]
    assert view.block_tables.tolist() == [[3, 4, 9, 9, 9], [7, 9, 9, 9, 9], [0, 1, 2, 9, 9], [9] * 5]
    assert view.seq_index.tolist() == [0, 1, 2, 3] and view.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    # A smaller step in the same bucket leaves nothing of the larger one behind.
    input_ids, common = _decode_step([2], [[5]])
    buffers.fill(4, input_ids, common)
    assert buffers.view(4).block_tables.tolist() == [[5, 9, 9, 9, 9]] + [[9] * 5] * 3
    assert buffers.view(4).slot_mapping.tolist() == [5 * 4 + 1] + [PADDING_BLOCK * 4] * 3
    assert buffers.view(4).seq_lens.tolist() == [2, 1, 1, 1]


def test_fill_refuses_a_step_larger_than_the_bucket_or_not_one_token_per_sequence() -> None:
    buffers = DecodeBuffers.allocate(4, 5, PADDING_BLOCK, BLOCK_SIZE, torch.device("cpu"))
    input_ids, common = _decode_step([2, 3, 4], [[1], [2], [3, 4]])
    with pytest.raises(ValueError, match="does not fit"):
        buffers.fill(2, input_ids, common)
    with pytest.raises(ValueError, match="does not fit"):
        buffers.fill(4, input_ids[:2], common)


def test_capture_off_cuda_says_why() -> None:
    buffers = DecodeBuffers.allocate(2, 5, PADDING_BLOCK, BLOCK_SIZE, torch.device("cpu"))
    graphs = DecodeGraphs(lambda batch: batch.input_ids, {"attention": TORCH_REF_BACKEND}, [1, 2], buffers, 20)
    with pytest.raises(RuntimeError, match="need a CUDA device.*--enforce-eager"):
        graphs.capture()
