"""The `cpu_paged` attention backend: a C++ kernel reading K/V straight from the paged cache (CPU only).

The kernel (`ops/cpp/csrc/paged_attention.cpp`) walks each sequence's block table instead of gathering
and padding its history as torch_ref does, computes an fp32 online softmax per (token, kv head), and
splits long key ranges when there are too few items for the threads (merged by log-sum-exp). It takes
the sequences with at most `MAX_KERNEL_QUERY_LEN` new tokens (decodes, short extends); longer prefill
chunks go to torch_ref's `attend_padded_group` (CPU flash attention, GEMM-based: 3-7x faster there,
measured at 128-512 tokens). Metadata is the common one plus both partitions, built once per step from host
lists. The extension is compiled on first use and cached (`ops/cpp/jit.py`); where that is impossible
the registry skips this backend with the reason (`skip_reason`, the catalog's `available` condition).
It reads an fp8 cache too (`kv_quant.py`): rows are quantized on write and the kernel multiplies them by the
layer's scales while widening them to fp32.
Usage: `--attention-backend cpu_paged` (chosen by priority on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rapid_llm import ops
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.attention.kv_quant import KVScales, is_fp8_kv, write_kv_cache_fp8
from rapid_llm.ops.attention.torch_ref import PaddedGroup, attend_padded_group, build_padded_group
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS

# The kernel beats padded SDPA up to ~4 new tokens after a 500-token context (bf16, 1 thread: 143 vs
# 161 us at 4 tokens, 299 vs 180 us at 8).
MAX_KERNEL_QUERY_LEN = 4


@dataclass
class CpuPagedMetadata(AttentionMetadata):
    kernel_seq_ids: torch.Tensor | None = None  # [S'] int64, the sequences the C++ kernel computes
    prefill_group: PaddedGroup | None = None  # the longer chunks, for scaled_dot_product_attention


class CpuPagedBackend(AttentionBackend):
    supports_fp8_kv = True

    def build_metadata(self, layout: StepLayout, device: torch.device) -> CpuPagedMetadata:
        common = build_common_metadata(layout, device)
        short = [i for i, length in enumerate(layout.query_lens) if length <= MAX_KERNEL_QUERY_LEN]
        long = [i for i, length in enumerate(layout.query_lens) if length > MAX_KERNEL_QUERY_LEN]
        return CpuPagedMetadata(
            **vars(common),
            kernel_seq_ids=torch.tensor(short, dtype=torch.int64, device=device) if short else None,
            prefill_group=build_padded_group(common, torch.tensor(long, dtype=torch.int64, device=device),
                                             layout.block_size) if long else None,
        )

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: CpuPagedMetadata, scale: float, sliding_window: int | None,
                kv_scales: KVScales | None = None) -> torch.Tensor:
        scales = kv_scales or KVScales()
        if is_fp8_kv(kv_cache.dtype):
            write_kv_cache_fp8(key, value, kv_cache, metadata.slot_mapping, scales)
        else:
            ops.kv_cache_store(key, value, kv_cache, metadata.slot_mapping)
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        if metadata.kernel_seq_ids is not None:
            CPU_OPS.load().paged_attention(output, query, kv_cache, metadata.query_start_loc, metadata.seq_lens,
                                           metadata.block_tables, metadata.kernel_seq_ids, scale,
                                           sliding_window or 0, scales.k_scale, scales.v_scale)
        if metadata.prefill_group is not None:
            attend_padded_group(output, query, kv_cache, metadata.prefill_group, scale, sliding_window, kv_scales)
        return output


CPU_PAGED_BACKEND = CpuPagedBackend()  # stateless: one instance serves every layer and step
