"""The `cpu_paged` attention backend: a C++ kernel reading K/V straight from the paged cache (CPU only).

The kernel (`ops/cpp/csrc/paged_attention.cpp`) walks each sequence's block table instead of gathering
and padding its history as torch_ref does, computes an fp32 online softmax per (token, kv head), and
splits long key ranges when there are too few items for the threads (merged by log-sum-exp). It takes
the sequences with few new tokens (decodes, verification steps, short extends; `kernel_query_limit`: more
with the AVX-512 BF16 kernel). Longer prefill chunks go to the tiled prefill kernel
(`csrc/prefill_attention.cpp`: query tiles x key tiles, the causal triangle only) where the CPU has AVX-512
BF16 and the query is bf16, else to torch_ref's `attend_padded_group` (PyTorch's CPU flash attention over
a padded, masked rectangle). Metadata is the common one; the partitions are built at the step's first
layer, which knows the dtypes that choose the kernels. The extension is
compiled on first use and cached (`ops/cpp/jit.py`); where that is impossible the registry skips this
backend with the reason (`skip_reason`, the catalog's `available` condition).
It reads an fp8 cache too (`kv_quant.py`): rows are quantized on write and the kernel multiplies them by the
layer's scales while widening them to fp32. The `cpu_amx` backend is the same with the tiled prefill kernel's
products on AMX tiles (head dims that are multiples of 32).
Usage: `--op-backend attention=cpu_paged` or `attention=cpu_amx` (chosen by priority on a CPU; cpu_amx where AMX
is).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from rapid_llm import ops
from rapid_llm.ops.attention.backend import AttentionBackend, AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.attention.kv_quant import UNIT_KV_SCALES, KVScales, is_fp8_kv, write_kv_cache_fp8
from rapid_llm.ops.attention.torch_ref import PaddedGroup, attend_padded_group, build_padded_group
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS

# Kernel time / padded SDPA time, 6 query and 2 kv heads of 64, 1 thread, 8 sequences after 450 cached
# tokens and 1 after 450 or 1,500 (2-core AMD EPYC, no AMX): the generic kernel (fp32) 0.75-0.95 at 4 new
# tokens and 0.98-1.26 at 8; the AVX-512 BF16 kernel 0.30-0.53 at 4, 0.46-0.59 at 8, 0.49-0.90 at 16 and
# 0.9-1.06 at 32-64.
MAX_KERNEL_QUERY_LEN = 4
MAX_BF16_KERNEL_QUERY_LEN = 16
_BF16_KERNEL_HEAD_DIMS = (32, 64, 128, 256)


@dataclass
class CpuPagedMetadata(AttentionMetadata):
    query_lens: tuple[int, ...] = ()
    block_size: int = 16
    kernel_limit: int = 0  # the query-length limit the partition below was built for (0: not built yet)
    tiled_prefill: bool = False  # whether the partition sent the longer chunks to the tiled prefill kernel
    kernel_seq_ids: torch.Tensor | None = None  # [S'] int64, the sequences the paged kernel computes
    tiled_seq_ids: torch.Tensor | None = None  # [S'] int64, the longer chunks for the tiled prefill kernel
    prefill_group: PaddedGroup | None = None  # the longer chunks, for scaled_dot_product_attention


@cache
def _bf16_kernel_built() -> bool:
    return CPU_OPS.load().paged_attention_bf16_kernel()


@cache
def _tiled_prefill_head_dims() -> tuple[int, ...]:
    return tuple(CPU_OPS.load().prefill_attention_head_dims())


def takes_tiled_prefill(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the tiled prefill kernel computes this layer's long chunks (bf16 query, bf16 or fp8 cache)."""
    return (query.dtype == torch.bfloat16 and kv_cache.dtype in (torch.bfloat16, torch.float8_e4m3fn)
            and query.shape[-1] in _tiled_prefill_head_dims())


def kernel_query_limit(query: torch.Tensor, kv_cache: torch.Tensor) -> int:
    """The most new tokens a sequence may have for the C++ kernel to compute it."""
    if (query.dtype == kv_cache.dtype == torch.bfloat16 and query.shape[-1] in _BF16_KERNEL_HEAD_DIMS
            and _bf16_kernel_built()):
        return MAX_BF16_KERNEL_QUERY_LEN
    return MAX_KERNEL_QUERY_LEN


class CpuPagedBackend(AttentionBackend):
    supports_fp8_kv = True

    def __init__(self, amx_tiles: bool = False) -> None:
        self.amx_tiles = amx_tiles  # the tiled prefill kernel's products on AMX tiles

    def build_metadata(self, layout: StepLayout, device: torch.device) -> CpuPagedMetadata:
        return CpuPagedMetadata(**vars(build_common_metadata(layout, device)), query_lens=tuple(layout.query_lens),
                                block_size=layout.block_size)

    @staticmethod
    def _partition(metadata: CpuPagedMetadata, limit: int, tiled_prefill: bool) -> None:
        short = [i for i, length in enumerate(metadata.query_lens) if length <= limit]
        long = [i for i, length in enumerate(metadata.query_lens) if length > limit]
        device = metadata.seq_lens.device
        metadata.kernel_seq_ids = torch.tensor(short, dtype=torch.int64, device=device) if short else None
        long_ids = torch.tensor(long, dtype=torch.int64, device=device) if long else None
        metadata.tiled_seq_ids = long_ids if tiled_prefill else None
        metadata.prefill_group = (build_padded_group(metadata, long_ids, metadata.block_size)
                                  if long_ids is not None and not tiled_prefill else None)
        metadata.kernel_limit = limit
        metadata.tiled_prefill = tiled_prefill

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: CpuPagedMetadata, scale: float, sliding_window: int | None,
                kv_scales: KVScales | None = None) -> torch.Tensor:
        scales = kv_scales or UNIT_KV_SCALES
        if is_fp8_kv(kv_cache.dtype):
            write_kv_cache_fp8(key, value, kv_cache, metadata.slot_mapping, scales)
        else:
            ops.kv_cache_store(key, value, kv_cache, metadata.slot_mapping)
        limit, tiled_prefill = kernel_query_limit(query, kv_cache), takes_tiled_prefill(query, kv_cache)
        if metadata.kernel_limit != limit or metadata.tiled_prefill != tiled_prefill:
            self._partition(metadata, limit, tiled_prefill)
        output = torch.empty_like(query, memory_format=torch.contiguous_format)
        common = (metadata.query_start_loc, metadata.seq_lens, metadata.block_tables)
        if metadata.kernel_seq_ids is not None:
            CPU_OPS.load().paged_attention(output, query, kv_cache, *common, metadata.kernel_seq_ids, scale,
                                           sliding_window or 0, scales.k_scale, scales.v_scale)
        if metadata.tiled_seq_ids is not None:
            CPU_OPS.load().prefill_attention(output, query, kv_cache, *common, metadata.tiled_seq_ids, scale,
                                             sliding_window or 0, scales.k_scale, scales.v_scale, self.amx_tiles)
        if metadata.prefill_group is not None:
            attend_padded_group(output, query, kv_cache, metadata.prefill_group, scale, sliding_window, kv_scales)
        return output


CPU_PAGED_BACKEND = CpuPagedBackend()  # stateless: one instance serves every layer and step
CPU_AMX_BACKEND = CpuPagedBackend(amx_tiles=True)
