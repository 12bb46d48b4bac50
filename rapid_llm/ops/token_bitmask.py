"""The `apply_token_bitmask` op: set to -inf every logit whose token a grammar's bitmask forbids.

The bitmask is xgrammar's layout: int32 [B, ceil(V / 32)], bit j of word i allows token 32 * i + j;
bits past V are ignored, and a row of all ones (-1) leaves its logits unchanged. Implementations may
write into `logits` (the sampler hands them its own float32 copy) and return it. `torch_ref` unpacks
the bits with shifts; `xgrammar` calls the library's kernel (CUDA/Triton on GPU; its CPU one costs ~30 ns a
word); `cpu_cpp` is one pass in the project's CPU extension that skips all-ones words and fills all-zeros ones.
Usage: `logits = ops.apply_token_bitmask(logits [B, V] float32, bitmask [B, W] int32 on logits' device)`.
"""

from __future__ import annotations

import torch


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """The reference: unpack [B, W] words into [B, W * 32] bits and mask the first V."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    # Arithmetic right shift keeps the sign bit, but `& 1` reads only bit j, so negative words are fine.
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, : logits.shape[-1]]
    return logits.masked_fill_(bits == 0, float("-inf"))


def apply_token_bitmask_xgrammar(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """xgrammar's in-place kernel, for logits at least as wide as the vocabulary the mask was filled for."""
    import xgrammar

    xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1])
    return logits


def apply_token_bitmask_cpu_cpp(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """The CPU extension's kernel (rapid_llm/ops/cpp/csrc/token_bitmask.cpp), in place on [B, V] float32 rows."""
    from rapid_llm.ops.cpp.cpu_ops import CPU_OPS

    CPU_OPS.load().apply_token_bitmask(logits, bitmask.contiguous())
    return logits
