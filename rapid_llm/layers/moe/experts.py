"""Routed experts: every expert's SwiGLU MLP stacked into two tensors, computed by `ops.fused_moe`.

The checkpoint's per-expert matrices are stacked once at load into w13 [E, 2I, H] (each expert's gate then
up rows, so one GEMM per expert serves both) and w2 [E, H, I]; the loader's shard id is (expert,
"gate" | "up" | "down"), whatever the checkpoint calls them (see `expert_stacked_params`). Routing happens
before (router.py), so the op only gathers, computes and sums. With tensor parallelism every expert is split
by its intermediate size: a rank holds its rows of gate and up and its columns of down, so its output is a
partial sum that the MoE block all-reduces once (with the shared experts'). Expert parallelism, which keeps
experts whole and partitions them instead, is the subclass in ep_experts.py.
After loading, `prepare_weights` selects the fused_moe kernel (rapid_llm/ops/moe_kernel.py) and stores both
tensors in its format (cpu_amx packs them), as linear layers do. A quantized model gives the layer an MoE
method before loading (`set_moe_method`, rapid_llm/quantization/moe_method.py): it owns the experts' tensors
and scales, and its `prepare` sets the kernel. `swiglu_limit` (DeepSeek-V4) clamps gate and up before the
activation.
Usage: `FusedExperts(num_experts, hidden, intermediate)(x [T, H], weights [T, k], expert_ids [T, k])`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rapid_llm.distributed import get_tp_rank, get_tp_size
from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.moe import TORCH_MOE
from rapid_llm.ops.moe_kernel import MoEKernel
from rapid_llm.ops.registry import REGISTRY

if TYPE_CHECKING:
    from rapid_llm.quantization.moe_method import MoEMethod

SHARDS = ("gate", "up", "down")


class FusedExperts(nn.Module):
    """w13_weight [E, 2I, H] = [gate | up] and w2_weight [E, H, I] of all experts."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, swiglu_limit: float | None = None,
                 num_slots: int | None = None, split: tuple[int, int] | None = None) -> None:
        """`num_slots` experts are stored (default all); `split` = (rank, ranks) the intermediate size is split
        over (default the tensor-parallel group)."""
        super().__init__()
        self.split_rank, self.split_size = split or (get_tp_rank(), get_tp_size())
        if intermediate_size % self.split_size:
            raise ValueError(f"the experts' intermediate size ({intermediate_size}) is not divisible by the "
                             f"tensor-parallel size ({self.split_size})")
        intermediate_size //= self.split_size
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.swiglu_limit = swiglu_limit
        self.kernel: MoEKernel = TORCH_MOE  # until prepare_weights: the checkpoint layout
        self.moe_method: MoEMethod | None = None  # None: the experts stay in the model dtype
        slots = num_experts if num_slots is None else num_slots
        self.w13_weight = nn.Parameter(torch.empty(slots, 2 * intermediate_size, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(slots, hidden_size, intermediate_size), requires_grad=False)
        self.w13_weight.weight_loader = self.w2_weight.weight_loader = self.weight_loader

    def expert_shard(self, shard_id: object) -> tuple[int, str]:
        """(expert, "gate" | "up" | "down") of a loader's shard id, checked."""
        if not (isinstance(shard_id, tuple) and len(shard_id) == 2 and isinstance(shard_id[0], int)
                and 0 <= shard_id[0] < self.num_experts and shard_id[1] in SHARDS):
            raise ValueError(f"expert shard_id must be (expert in [0, {self.num_experts}), one of {SHARDS}), "
                             f"got {shard_id!r}")
        return shard_id

    def shard_rows(self, param: nn.Parameter, expert: int, shard: str, rows_per_entry: int = 1) -> torch.Tensor:
        """The slice of `param` [E, rows, ...] a shard fills: gate's or up's half of w13's rows, all of w2's;
        `rows_per_entry` output rows share one entry (block scales: block_n)."""
        target = param.data[expert]
        if shard == "down":
            return target
        rows = self.intermediate_size // rows_per_entry
        return target.narrow(0, 0 if shard == "gate" else rows, rows)

    def rank_part(self, loaded: torch.Tensor, shard: str) -> torch.Tensor:
        """This rank's part of a checkpoint matrix: its rows of gate/up, its columns of down."""
        if self.split_size == 1:
            return loaded
        width = self.intermediate_size
        return loaded.narrow(1 if shard == "down" else 0, self.split_rank * width, width)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        expert, shard = self.expert_shard(shard_id)
        copy_weight(self.shard_rows(param, expert, shard), self.rank_part(loaded, shard))

    def set_moe_method(self, method: MoEMethod) -> None:
        """Before loading: let `method` own the experts' weight format (it creates the tensors the checkpoint fills)."""
        if get_tp_size() > 1:
            # ParallelConfig refuses quantized checkpoints with --tp > 1 first; this guards other callers.
            raise NotImplementedError("quantized experts are not split over tensor-/expert-parallel ranks yet")
        self.moe_method = method
        method.create_weights(self)

    def prepare_weights(self) -> None:
        """Once, after loading: pick the fused_moe kernel and put both weights in its format (from then on
        w13_weight / w2_weight may be in that format, not the checkpoint's). A second call does nothing."""
        if self.kernel is not TORCH_MOE:
            return
        if self.moe_method is not None:
            self.moe_method.prepare(self)
            return
        self.kernel = REGISTRY.select("fused_moe", self.w13_weight.device, self.w13_weight.dtype).fn
        w13, w2 = self.kernel.prepare(self.w13_weight.data, self.w2_weight.data)
        self.w13_weight = nn.Parameter(w13, requires_grad=False)
        self.w2_weight = nn.Parameter(w2, requires_grad=False)

    def forward(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        if self.swiglu_limit is None:
            return self.kernel(hidden_states, topk_weights, topk_ids, self.w13_weight, self.w2_weight)
        return self.kernel(hidden_states, topk_weights, topk_ids, self.w13_weight, self.w2_weight, self.swiglu_limit)
