"""GPTQ (v1) and AWQ (GEMM) checkpoint tensors <-> the canonical int4 form of int4_math, both directions.

GPTQ: `qweight` int32 [in / 8, out] (packed along inputs), `qzeros` int32 [groups, out / 8] holding zero - 1,
`scales` [groups, out], `g_idx` int32 [in] (each input channel's group; act-order permutes it).
AWQ: `qweight` int32 [in, out / 8] and `qzeros` int32 [groups, out / 8], both packed along outputs in AWQ_ORDER,
zeros stored as they are, `scales` [groups, out]; groups are contiguous runs of input channels.
`contiguous_groups` turns any g_idx whose groups all have the same size into contiguous groups plus the input
permutation that makes them so (None when it is the identity), the form every kernel takes.
"""

from __future__ import annotations

import torch

from rapid_llm.config.dtypes import dtype_from_name
from rapid_llm.quantization.int4_math import AWQ_ORDER, pack_int32, unpack_int32

SCALE_DTYPE = dtype_from_name("float16")  # as AutoGPTQ / AutoAWQ store scales

Canonical = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q [out, in] uint8, scales, zeros fp32 [out, groups]


def gptq_to_canonical(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> Canonical:
    zeros = unpack_int32(qzeros, dim=1).float() + 1  # v1 stores zero - 1
    return unpack_int32(qweight, dim=0).t(), scales.float().t(), zeros.t()


def awq_to_canonical(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> Canonical:
    zeros = unpack_int32(qzeros, dim=1, order=AWQ_ORDER).float()
    return unpack_int32(qweight, dim=1, order=AWQ_ORDER).t(), scales.float().t(), zeros.t()


def canonical_to_gptq(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      g_idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Checkpoint tensors of one linear layer (v1 zeros; `g_idx` [in] gives each q column's group). v1 cannot
    store a zero of 0 (it would be -1), so such a grid is refused: quantize with `min_zero=1`."""
    if bool((zeros < 1).any()):
        raise ValueError("GPTQ v1 checkpoints cannot hold a zero point of 0; quantize with min_zero=1")
    return {"qweight": pack_int32(q.t(), dim=0), "qzeros": pack_int32(zeros.t() - 1, dim=1),
            "scales": scales.t().to(SCALE_DTYPE).contiguous(), "g_idx": g_idx.to(torch.int32)}


def canonical_to_awq(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"qweight": pack_int32(q.t(), dim=1, order=AWQ_ORDER),
            "qzeros": pack_int32(zeros.t(), dim=1, order=AWQ_ORDER),
            "scales": scales.t().to(SCALE_DTYPE).contiguous()}


def contiguous_groups(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
    """(q, scales, zeros, group_size, perm) with the groups g_idx names made contiguous: column j of the result is
    input channel perm[j]. Raises when g_idx gives its groups different sizes or names a missing group."""
    in_features = q.shape[1]
    perm = torch.argsort(g_idx, stable=True)
    ordered = g_idx[perm].long()
    used, counts = torch.unique_consecutive(ordered, return_counts=True)
    if int(counts.min()) != int(counts.max()):
        raise ValueError(f"g_idx gives its groups different sizes ({int(counts.min())} to {int(counts.max())} "
                         "input channels); only equal-sized groups load")
    if int(used.min()) < 0 or int(used.max()) >= scales.shape[1]:
        raise ValueError(f"g_idx names group {int(used.max())}, but scales hold {scales.shape[1]} groups")
    group_size = int(counts[0])
    identity = torch.equal(perm, torch.arange(in_features, device=perm.device))
    return (q if identity else q[:, perm], scales[:, used], zeros[:, used], group_size, None if identity else perm)
