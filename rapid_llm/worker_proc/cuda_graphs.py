"""CUDA graphs for decode steps: the model forward captured once per batch-size bucket, then replayed.

A step whose sequences all compute one token runs as the graph of the smallest bucket holding it
(buckets 1, 2, 4, then every 8 up to `--cuda-graph-max-bs`, as vLLM and SGLang size theirs). The graph
reads static buffers (`DecodeBuffers`, sized for the largest bucket; bucket b uses the first b rows): a
step copies its input ids and attention metadata into them, and pads the rows past its batch with the
input batch's padding block -- a padded row attends one key of that block and writes its K/V there, never
into a live block. Each paged cache group's backend wraps the static buffers into its own metadata once per
bucket (`graph_decode_metadata`, for any length up to max_model_len). Logits and the sampler run after the
replay, outside the graph, so sampling parameters never have to be static. Capture needs CUDA; elsewhere
`capture` raises saying so, and the runner never builds graphs off CUDA or with `--enforce-eager`.

Usage:
    graphs = DecodeGraphs(forward, {group: backend}, capture_sizes(max_bs), buffers, max_seq_len); graphs.capture()
    hidden = graphs.run(input_ids, common_metadata)  # None when the batch is larger than every bucket
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_batch_size: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, then multiples of 8, up to and including `max_batch_size`."""
    if max_batch_size < 1:
        raise ValueError(f"the largest CUDA graph batch size must be at least 1, got {max_batch_size}")
    sizes = [size for size in [1, 2, 4, *range(8, max_batch_size + 1, 8)] if size <= max_batch_size]
    return sizes if sizes[-1] == max_batch_size else [*sizes, max_batch_size]


def bucket_for(num_seqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size holding `num_seqs` sequences, or None when none does."""
    index = bisect.bisect_left(sizes, num_seqs)
    return sizes[index] if index < len(sizes) else None


@dataclass
class DecodeBuffers:
    """Static inputs of the largest bucket. Padded rows: token 0 at position 0 of a 1-token sequence held in
    the padding block, so they read and write that block only."""

    input_ids: torch.Tensor  # [B] int64
    positions: torch.Tensor  # [B] int64
    seq_index: torch.Tensor  # [B] int64, always 0..B-1 (one token per sequence)
    slot_mapping: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64
    query_start_loc: torch.Tensor  # [B + 1] int64, always 0..B
    block_tables: torch.Tensor  # [B, max_blocks] int64
    padding_block: int
    block_size: int

    @classmethod
    def allocate(cls, max_batch_size: int, max_blocks: int, padding_block: int, block_size: int,
                 device: torch.device) -> DecodeBuffers:
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.int64, device=device)

        arange = torch.arange(max_batch_size + 1, dtype=torch.int64, device=device)
        buffers = cls(zeros(max_batch_size), zeros(max_batch_size), arange[:-1].clone(), zeros(max_batch_size),
                      zeros(max_batch_size), arange, zeros(max_batch_size, max_blocks), padding_block, block_size)
        buffers.pad(0, max_batch_size)
        return buffers

    def view(self, batch_size: int) -> AttentionMetadata:
        """Bucket `batch_size`'s common metadata: views of the first rows, the same storage at every replay."""
        return AttentionMetadata(self.positions[:batch_size], self.seq_index[:batch_size],
                                 self.slot_mapping[:batch_size], self.seq_lens[:batch_size],
                                 self.query_start_loc[: batch_size + 1], self.block_tables[:batch_size])

    def pad(self, start: int, end: int) -> None:
        """Make rows [start, end) padding rows."""
        self.input_ids[start:end] = 0
        self.positions[start:end] = 0
        self.slot_mapping[start:end] = self.padding_block * self.block_size
        self.seq_lens[start:end] = 1
        self.block_tables[start:end] = self.padding_block

    def fill(self, batch_size: int, input_ids: torch.Tensor, common: AttentionMetadata) -> None:
        """Copy a decode step of n <= batch_size sequences into the first rows; pad the rest of the bucket."""
        num_seqs, width = common.block_tables.shape
        if input_ids.shape[0] != num_seqs or num_seqs > batch_size:
            raise ValueError(f"a decode step of {num_seqs} sequences ({input_ids.shape[0]} tokens) does not fit "
                             f"the {batch_size}-row bucket (one token per sequence)")
        self.input_ids[:num_seqs].copy_(input_ids)
        self.positions[:num_seqs].copy_(common.positions)
        self.slot_mapping[:num_seqs].copy_(common.slot_mapping)
        self.seq_lens[:num_seqs].copy_(common.seq_lens)
        self.block_tables[:num_seqs, :width].copy_(common.block_tables)
        self.block_tables[:num_seqs, width:] = self.padding_block
        self.pad(num_seqs, batch_size)


class DecodeGraphs:
    def __init__(self, forward: Callable[[ForwardBatch], torch.Tensor], backends: Mapping[str, AttentionBackend],
                 sizes: list[int], buffers: DecodeBuffers, max_seq_len: int) -> None:
        """`backends`: each paged cache group's backend by group name, the first one's metadata the batch's
        `attention`."""
        if not backends:
            raise ValueError("CUDA graphs capture paged attention: give at least one cache group's backend")
        self.forward = forward
        self.backends = dict(backends)
        self.sizes = sizes
        self.buffers = buffers
        self.max_seq_len = max_seq_len
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _batch(self, batch_size: int) -> ForwardBatch:
        common = self.buffers.view(batch_size)
        groups = {name: backend.graph_decode_metadata(common, self.max_seq_len)
                  for name, backend in self.backends.items()}
        return ForwardBatch(input_ids=self.buffers.input_ids[:batch_size], attention=next(iter(groups.values())),
                            groups=groups)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first (the smaller ones reuse its memory pool)."""
        device = self.buffers.input_ids.device
        if device.type != "cuda":
            raise RuntimeError(f"CUDA graphs need a CUDA device, the model is on {device.type}; run with "
                               "--enforce-eager")
        for backend in self.backends.values():
            if not backend.supports_cuda_graphs:
                raise RuntimeError(f"the attention backend {type(backend).__name__} cannot be captured in a CUDA "
                                   "graph; run with --enforce-eager or pin --attention-backend triton")
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for batch_size in reversed(self.sizes):
            self.buffers.pad(0, batch_size)
            # Warm-up runs outside capture: Triton compiles and autotunes on first launch, which capture forbids.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.forward(self._batch(batch_size))
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = self.forward(self._batch(batch_size))
            self.graphs[batch_size] = (graph, output)
        torch.cuda.synchronize()
        logger.info("captured %d decode CUDA graphs (batch sizes %s) in %.1f s", len(self.sizes), self.sizes,
                    time.perf_counter() - start)

    def run(self, input_ids: torch.Tensor, common: AttentionMetadata) -> torch.Tensor | None:
        """Replay the bucket holding this decode step; its hidden states [n, hidden] (a view of the graph's output,
        valid until the next replay). None when no bucket is large enough."""
        batch_size = bucket_for(input_ids.shape[0], self.sizes)
        if batch_size is None:
            return None
        self.buffers.fill(batch_size, input_ids, common)
        graph, output = self.graphs[batch_size]
        graph.replay()
        return output[: input_ids.shape[0]]
