"""Routed experts: every expert's SwiGLU MLP stacked into two tensors, computed by `ops.fused_moe`.

The checkpoint's per-expert matrices are stacked once at load into w13 [E, 2I, H] (each expert's gate then
up rows, so one GEMM per expert serves both) and w2 [E, H, I]; the loader's shard id is (expert,
"gate" | "up" | "down"), whatever the checkpoint calls them (see `expert_stacked_params`). Routing happens
before (router.py), so the op only gathers, computes and sums. Expert and tensor parallelism are not
built: the layer refuses tp > 1.
After loading, `prepare_weights` selects the fused_moe kernel (rapid_llm/ops/moe_kernel.py) and stores both
tensors in its format (cpu_amx packs them), as linear layers do. `swiglu_limit` (DeepSeek-V4) clamps gate
and up before the activation.
Usage: `FusedExperts(num_experts, hidden, intermediate)(x [T, H], weights [T, k], expert_ids [T, k])`.
"""

from __future__ import annotations

import torch
from torch import nn

from rapid_llm.distributed import get_tp_size
from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.moe import TORCH_MOE
from rapid_llm.ops.moe_kernel import MoEKernel
from rapid_llm.ops.registry import REGISTRY

_SHARDS = ("gate", "up", "down")


class FusedExperts(nn.Module):
    """w13_weight [E, 2I, H] = [gate | up] and w2_weight [E, H, I] of all experts."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 swiglu_limit: float | None = None) -> None:
        super().__init__()
        if get_tp_size() > 1:
            raise NotImplementedError("expert/tensor parallel MoE is not built yet: serve MoE models with --tp 1")
        self.intermediate_size = intermediate_size
        self.swiglu_limit = swiglu_limit
        self.kernel: MoEKernel = TORCH_MOE  # until prepare_weights: the checkpoint layout
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size),
                                       requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False)
        self.w13_weight.weight_loader = self.w2_weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if not (isinstance(shard_id, tuple) and len(shard_id) == 2 and isinstance(shard_id[0], int)
                and 0 <= shard_id[0] < param.shape[0] and shard_id[1] in _SHARDS):
            raise ValueError(f"expert shard_id must be (expert in [0, {param.shape[0]}), one of {_SHARDS}), "
                             f"got {shard_id!r}")
        expert, shard = shard_id
        target = param.data[expert]
        if shard != "down":
            rows = self.intermediate_size
            target = target.narrow(0, 0 if shard == "gate" else rows, rows)
        copy_weight(target, loaded)

    def prepare_weights(self) -> None:
        """Once, after loading: pick the fused_moe kernel and put both weights in its format (from then on
        w13_weight / w2_weight may be in that format, not the checkpoint's). A second call does nothing."""
        if self.kernel is not TORCH_MOE:
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
