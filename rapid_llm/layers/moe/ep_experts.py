"""Expert-parallel routed experts: whole experts partitioned over the ranks, tokens moved by all-to-all.

Each rank stores `slots_per_rank` physical slots ((num_experts + num_redundant_experts) / ranks) of whole
experts (no intermediate split) and loads only the checkpoint matrices of the experts its slots hold. A
forward takes the routing of the whole batch (every rank has it); the `expert_all_to_all` op's dispatcher
brings this rank the pairs routed to its slots (by default it gathers them from all tokens, moving nothing:
distributed/replicated_dispatch.py; its torch_ref sends each rank's share of the tokens by all-to-all:
distributed/expert_parallel.py), the fused_moe kernel computes them (one expert each, with its routing weight, so
rounding is the single-rank kernel's), and `combine` sums them per token into a partial output that the MoE
block's all-reduce completes. With EPLB the layer counts each expert's load every step and, every `step_interval` steps,
re-places its experts when that lowers the busiest rank's load (rapid_llm/distributed/eplb.py), logging the new
placement (one line per MoE layer, in layer order).
Usage: built by SparseMoeBlock inside `building_expert_parallel(layout)` on more than one rank.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from rapid_llm.distributed import get_tp_rank, get_tp_size
from rapid_llm.distributed.eplb import (ExpertLoad, ExpertPlacement, balanced_placement, move_experts,
                                        rank_loads)
from rapid_llm.distributed.expert_parallel import AllToAllDispatcher, ExpertParallelLayout
from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.registry import REGISTRY

logger = logging.getLogger(__name__)


class ExpertParallelExperts(FusedExperts):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, layout: ExpertParallelLayout,
                 swiglu_limit: float | None = None) -> None:
        self.ep_rank, self.ep_size = get_tp_rank(), get_tp_size()
        num_slots = num_experts + layout.num_redundant_experts
        if num_slots % self.ep_size:
            raise ValueError(f"{num_slots} expert slots (num_experts + num_redundant_experts) do not divide over "
                             f"{self.ep_size} expert-parallel ranks")
        self.slots_per_rank = num_slots // self.ep_size
        super().__init__(num_experts, hidden_size, intermediate_size, swiglu_limit, num_slots=self.slots_per_rank,
                         split=(0, 1))
        self.placement = ExpertPlacement.initial(num_experts, num_slots)
        self.eplb = layout.eplb
        self.load = ExpertLoad(num_experts, layout.eplb.window_size) if layout.eplb is not None else None
        self.dispatcher: AllToAllDispatcher = REGISTRY.select("expert_all_to_all", self.w13_weight.device,
                                                              self.w13_weight.dtype).fn

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        expert, shard = self.expert_shard(shard_id)
        # Experts this rank does not hold are skipped: their tensors are never copied.
        for slot in self.placement.slots_of(expert, self.ep_rank, self.slots_per_rank):
            copy_weight(self.shard_rows(param, slot, shard), loaded)

    def forward(self, hidden_states: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        if self.load is not None and self.eplb is not None:
            self._balance(self.load, self.eplb.step_interval, topk_ids)
        start, end = self.dispatcher.token_range(hidden_states.shape[0], self.ep_rank, self.ep_size)
        top_k = topk_ids.shape[1]
        physical = self.placement.choose(topk_ids[start:end], start * top_k)
        dispatched = self.dispatcher.dispatch(hidden_states[start:end], topk_weights[start:end], physical,
                                              self.slots_per_rank)
        computed = hidden_states.new_zeros(0, self.hidden_size)
        if dispatched.hidden.shape[0]:
            computed = super().forward(dispatched.hidden, dispatched.weights.unsqueeze(1),
                                       dispatched.local_slots.unsqueeze(1))
        output = hidden_states.new_zeros(hidden_states.shape)
        output[start:end] = self.dispatcher.combine(computed, dispatched, end - start)
        return output

    def _balance(self, counter: ExpertLoad, step_interval: int, topk_ids: torch.Tensor) -> None:
        """Count this step's load; every `step_interval` steps re-place the experts (all ranks at the same step)."""
        counter.record(topk_ids)
        if counter.steps % step_interval:
            return
        load, old = counter.total(), self.placement
        new = ExpertPlacement(balanced_placement(load, old.physical_to_logical.numel(), self.ep_size,
                                                 old.physical_to_logical), self.num_experts)
        before, after = rank_loads(load, old, self.ep_size), rank_loads(load, new, self.ep_size)
        if max(after) >= max(before):
            return  # moving weights would not relieve the busiest rank
        moved = move_experts([self.w13_weight.data, self.w2_weight.data], old.physical_to_logical,
                             new.physical_to_logical, self.ep_rank, self.slots_per_rank)
        self.placement = new
        logger.info("EPLB step %d: %d slots moved; physical->logical %s; rank loads %s -> %s", counter.steps,
                    moved, new.physical_to_logical.tolist(), _rounded(before), _rounded(after))


def _rounded(values: list[float]) -> list[float]:
    return [round(value, 1) for value in values]
