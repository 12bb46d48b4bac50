"""Token slots sorted by expert and padded per expert to whole blocks, for the grouped GEMM of fused_moe.

Slot s = token * top_k + j is the j-th expert choice of a token. Each expert's slots (in slot order, as
the torch reference's stable sort has them) fill whole blocks of `block_m`, padded with the sentinel
`num_slots`, so every block belongs to one expert. Built with torch ops that never read a value back to the
host: the buffers are sized for the worst case (every used expert wastes block_m - 1 rows), so there is no
device sync and the shapes depend on the token count alone. Blocks past the last expert's get the
expert id `num_experts`, which the kernel skips.
Usage: `sorted_slots, block_experts = align_slots(topk_ids, num_experts, block_m)`.
"""

from __future__ import annotations

import torch


def align_slots(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot of each padded row [blocks * block_m], int32; expert of each block [blocks], int32)."""
    flat = topk_ids.flatten().long()  # ids may come as int32 (e.g. a hash-routing table)
    num_slots = flat.numel()
    sorted_experts, slots = flat.sort(stable=True)
    # scatter_add_, not bincount: bincount on CUDA reads the max back to size its output.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    padded_starts = padded_ends - padded
    starts = counts.cumsum(0) - counts
    rank = torch.arange(num_slots, device=flat.device) - starts[sorted_experts]
    blocks = -(-(num_slots + min(num_experts, num_slots) * (block_m - 1)) // block_m)
    sorted_slots = torch.full((blocks * block_m,), num_slots, dtype=torch.int32, device=flat.device)
    sorted_slots[padded_starts[sorted_experts] + rank] = slots.to(torch.int32)
    block_starts = torch.arange(blocks, device=flat.device) * block_m
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True).to(torch.int32)
    return sorted_slots, block_experts
