"""The `cpu_cpp` lora op: each grouped token's adapter delta added into out by the CPU extension (`csrc/lora.cpp`).

Where `lora_grouped` (ops/multi_lora.py) runs two fp32 GEMMs per present slot and converts that slot's A and B to
fp32 on every call, the C++ pass reads each A and B once in their own dtype (AVX-512 BF16 dot products for the
shrink on bf16), keeps the shrink in fp32 and adds into out with one rounding, as the op specifies. It reads the
slot grouping (`LoRAIndices.slot_starts`, `sorted_tokens`) on the host, which is free on CPU. fp32 and fp16 calls
of more tokens than MAX_TOKENS go to `lora_grouped`, whose GEMMs are faster there (bf16: the C++ pass measured
faster at every size up to 2048 tokens); so does an `out` whose columns are strided.
Usage: chosen by priority on a CPU where the extension builds, or `--op-backend lora=cpu_cpp`.
"""

from __future__ import annotations

import torch

from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.multi_lora import LoRAIndices, check_lora_args, lora_grouped

# Tokens per call up to which the C++ pass beats lora_grouped, per dtype (measured on 1 thread, AMD EPYC with
# avx512_bf16, ranks 16-48 over in 768-2560, out 768-5120); a dtype not listed has no limit.
MAX_TOKENS = {dtype_from_name("fp32"): 64, dtype_from_name("fp16"): 256}


def lora(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, indices: LoRAIndices,
         out: torch.Tensor) -> None:
    check_lora_args(x, lora_a, lora_b, indices, out)
    limit = MAX_TOKENS.get(x.dtype)
    if (limit is not None and x.shape[0] > limit) or (out.stride(1) != 1 and out.shape[1] > 1):
        lora_grouped(x, lora_a, lora_b, indices, out)
        return
    CPU_OPS.load().lora(x.contiguous(), lora_a.contiguous(), lora_b.contiguous(), indices.slot_starts,
                        indices.sorted_tokens, out)
