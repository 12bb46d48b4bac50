"""op_backend settings the golden tests pin: every op to its torch reference, and bf16's near-tie pins; and
`pinned_backends`, which pins ops in this process for a `with` block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rapid_llm.ops.cpu_half import cpu_lacks_half_kernels
from rapid_llm.ops.registry import REGISTRY

ALL_REFERENCE = {"op_backend": ",".join(f"{op}=torch_ref" for op in REGISTRY.backends())}

# Pinned to the reference on both sides of a bf16 comparison: attention (the C++ kernel keeps probabilities
# in fp32 where SDPA rounds them to bf16, so near-tied logits of this random model may flip; its golden is the
# fp32 test, its bf16 accuracy tests/kernels/test_attention_cpu_paged.py) and, on CPUs without native
# bf16 kernels, linear (cpu_fp32 sums in another order than F.linear's bf16 path; tests/unit/test_op_registry.py).
BF16_PINNED = "attention=torch_ref" + (",linear=torch_ref" if cpu_lacks_half_kernels(torch.bfloat16) else "")


@contextmanager
def pinned_backends(overrides: dict[str, str]) -> Iterator[None]:
    """Pin ops to backends (as --op-backend does) inside the block; the previous pins come back after it."""
    previous = REGISTRY.overrides
    REGISTRY.set_overrides({**previous, **overrides})
    try:
        yield
    finally:
        REGISTRY.set_overrides(previous)
