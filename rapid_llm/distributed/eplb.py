"""Expert placement and its load balancing (EPLB): physical expert slots, their logical experts, rebalancing.

An expert-parallel MoE layer has num_experts + num_redundant_experts physical slots, `slots_per_rank` on each
rank (slot s lives on rank s // slots_per_rank); `ExpertPlacement` maps slots to logical experts and picks,
for each (token, k) pair, one replica of its expert (pairs cycle through the replicas, the same on every
rank). `ExpertLoad` counts the pairs routed to each logical expert over the last `window_size` steps;
every rank routes the whole batch, so the counts agree without a collective. Every `step_interval` steps
`balanced_placement` recomputes the layout: the redundant slots go one by one to the expert with the most
load per replica, then replicas are packed heaviest first onto the least-loaded rank with a free slot
(never two copies of an expert on one rank when avoidable), and a rank keeps an expert in the slot it
already occupies. `move_experts` then fetches each slot's new weights from a rank that held them.
Usage: see ExpertParallelExperts (rapid_llm/layers/moe/ep_experts.py).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


class ExpertPlacement:
    """physical_to_logical [slots]: which logical expert each physical slot holds."""

    def __init__(self, physical_to_logical: torch.Tensor, num_experts: int) -> None:
        self.num_experts = num_experts
        self.physical_to_logical = physical_to_logical
        counts = torch.bincount(physical_to_logical, minlength=num_experts)
        if (counts == 0).any():
            missing = (counts == 0).nonzero().flatten().tolist()
            raise ValueError(f"every expert needs a slot; experts without one: {missing}")
        self.replica_counts = counts
        # replicas[e, i]: expert e's i-th slot in slot order (rows padded with its first slot).
        self.replicas = torch.zeros(num_experts, int(counts.max()), dtype=torch.int64)
        for expert in range(num_experts):
            slots = (physical_to_logical == expert).nonzero().flatten()
            self.replicas[expert] = slots[torch.arange(self.replicas.shape[1]) % slots.numel()]

    @classmethod
    def initial(cls, num_experts: int, num_slots: int) -> ExpertPlacement:
        """Slot s holds expert s % num_experts: the first experts get the redundant copies until loads are known."""
        return cls(torch.arange(num_slots) % num_experts, num_experts)

    def choose(self, expert_ids: torch.Tensor, first_pair: int) -> torch.Tensor:
        """Physical slots [t, k] for logical `expert_ids` [t, k]; pair p (counted from `first_pair`, the
        share's position in the batch) takes replica p mod the expert's replica count."""
        pairs = torch.arange(expert_ids.numel(), device=expert_ids.device).view_as(expert_ids) + first_pair
        counts = self.replica_counts.to(expert_ids.device)[expert_ids]
        return self.replicas.to(expert_ids.device)[expert_ids, pairs % counts]

    def slots_of(self, expert: int, rank: int, slots_per_rank: int) -> list[int]:
        """The slots (rank-local indices) holding `expert` on `rank`."""
        local = self.physical_to_logical[rank * slots_per_rank:(rank + 1) * slots_per_rank]
        return (local == expert).nonzero().flatten().tolist()


class ExpertLoad:
    """Pairs routed to each logical expert in each of the last `window_size` steps (a ring of counts)."""

    def __init__(self, num_experts: int, window_size: int) -> None:
        self.window = torch.zeros(window_size, num_experts, dtype=torch.int64)
        self.steps = 0

    def record(self, expert_ids: torch.Tensor) -> None:
        # The ring lives on the routing's device, so counting never waits for the device.
        self.window = self.window.to(expert_ids.device)
        self.window[self.steps % self.window.shape[0]] = torch.bincount(expert_ids.flatten(),
                                                                        minlength=self.window.shape[1])
        self.steps += 1

    def total(self) -> torch.Tensor:
        return self.window.sum(dim=0).cpu()


def balanced_placement(load: torch.Tensor, num_slots: int, num_ranks: int,
                       current: torch.Tensor) -> torch.Tensor:
    """physical_to_logical [num_slots] spreading `load` [E] over `num_ranks` ranks (see the module docstring);
    `current` is the placement now, whose slots are kept where a rank keeps an expert."""
    num_experts = load.numel()
    slots_per_rank = num_slots // num_ranks
    replicas = [1] * num_experts
    for _ in range(num_slots - num_experts):
        hottest = max(range(num_experts), key=lambda e: (load[e].item() / replicas[e], -e))
        replicas[hottest] += 1
    copies = sorted(((load[e].item() / replicas[e], e) for e in range(num_experts) for _ in range(replicas[e])),
                    key=lambda item: (-item[0], item[1]))
    rank_load = [0.0] * num_ranks
    held: list[list[int]] = [[] for _ in range(num_ranks)]
    for share, expert in copies:
        free = [r for r in range(num_ranks) if len(held[r]) < slots_per_rank]
        fresh = [r for r in free if expert not in held[r]] or free
        rank = min(fresh, key=lambda r: (rank_load[r], r))
        held[rank].append(expert)
        rank_load[rank] += share
    placement = torch.empty(num_slots, dtype=torch.int64)
    for rank, experts in enumerate(held):
        old = current[rank * slots_per_rank:(rank + 1) * slots_per_rank].tolist()
        new: list[int | None] = [None] * slots_per_rank
        pending = list(experts)
        for slot, expert in enumerate(old):
            if expert in pending:
                new[slot] = expert
                pending.remove(expert)
        for slot in range(slots_per_rank):
            if new[slot] is None:
                new[slot] = pending.pop(0)
        placement[rank * slots_per_rank:(rank + 1) * slots_per_rank] = torch.tensor(new)
    return placement


def move_experts(weights: list[torch.Tensor], old: torch.Tensor, new: torch.Tensor, rank: int,
                 slots_per_rank: int) -> int:
    """Give each local slot of `weights` (tensors [slots_per_rank, ...]) the expert `new` assigns it, fetched from
    a slot that held it under `old`; every rank calls this with the same placements. Returns the slots filled."""
    before = [weight.clone() for weight in weights]  # sources, before any slot is overwritten
    moved = 0
    for slot in range(new.numel()):
        expert = int(new[slot])
        if int(old[slot]) == expert:
            continue
        destination = slot // slots_per_rank
        holders = (old == expert).nonzero().flatten()
        # A copy on the destination rank itself needs no transfer; else the first holder sends.
        local = holders[holders // slots_per_rank == destination]
        source_slot = int(local[0] if local.numel() else holders[0])
        source = source_slot // slots_per_rank
        for weight, original in zip(weights, before):
            if destination == rank and source == rank:
                weight[slot % slots_per_rank].copy_(original[source_slot % slots_per_rank])
            elif destination == rank:
                received = torch.empty_like(weight[0])
                dist.recv(received, src=source)
                weight[slot % slots_per_rank].copy_(received)
            elif source == rank:
                dist.send(original[source_slot % slots_per_rank].contiguous(), dst=destination)
        moved += 1
    return moved


def rank_loads(load: torch.Tensor, placement: ExpertPlacement, num_ranks: int) -> list[float]:
    """The load each rank serves under `placement`: an expert's load split evenly over its replicas."""
    per_slot = load.double()[placement.physical_to_logical] / placement.replica_counts.double()[
        placement.physical_to_logical]
    return per_slot.view(num_ranks, -1).sum(dim=1).tolist()
