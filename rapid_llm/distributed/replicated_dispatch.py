"""Expert-parallel dispatch without an exchange: every rank computes, from all tokens, the pairs routed to its slots.

The expert-parallel group is the tensor-parallel group, so after attention's all-reduce every rank holds every
token's hidden state and computes the same routing (a replicated router on identical inputs, as vLLM's EP without
DP assumes too). Sending pairs to their experts' ranks and back (expert_parallel.AllToAllDispatcher) then moves
nothing a rank could not read itself: here a rank gathers its own pairs, and the MoE block's all-reduce, which it
does anyway, sums the ranks' partial outputs, so it is the combine. A layer goes from 7 collectives (attention's
all-reduce, the count exchange, three payload all-to-alls, the combine, the block's all-reduce) to 2.
Key design choice, from a measured bottleneck of two-batch overlap: 5 of EP's 7 collectives follow almost no
compute (the router, a sort, an index_add), so the other micro-batch had nothing to hide them behind; with 2 per
layer, each follows attention or the experts (docs/parallelism.md, "Two-batch overlap").
Usage: the `expert_all_to_all` op's `replicated_routing` backend (ops/catalog.py), chosen over the all-to-all.
"""

from __future__ import annotations

import torch

from rapid_llm.distributed.expert_parallel import Dispatched
from rapid_llm.distributed.parallel_state import get_tp_rank


class ReplicatedRoutingDispatcher:
    def token_range(self, num_tokens: int, rank: int, size: int) -> tuple[int, int]:
        """Every rank dispatches from all tokens."""
        return 0, num_tokens

    def dispatch(self, hidden: torch.Tensor, weights: torch.Tensor, physical: torch.Tensor,
                 slots_per_rank: int) -> Dispatched:
        """The pairs (token t, k) of hidden [T, H], weights [T, k], physical slots [T, k] whose slot this rank
        holds, in token order."""
        flat = physical.flatten()
        mine = torch.nonzero(flat // slots_per_rank == get_tp_rank()).squeeze(1)
        source_tokens = mine // physical.shape[1]
        return Dispatched(hidden=hidden.index_select(0, source_tokens), local_slots=flat[mine] % slots_per_rank,
                          weights=weights.flatten()[mine], source_tokens=source_tokens, send_counts=[],
                          recv_counts=[])

    def combine(self, expert_output: torch.Tensor, dispatched: Dispatched, num_tokens: int) -> torch.Tensor:
        """This rank's partial output [T, H]: its pairs' weighted outputs summed per token (the block's all-reduce
        adds the other ranks')."""
        output = expert_output.new_zeros(num_tokens, expert_output.shape[1])
        return output.index_add_(0, dispatched.source_tokens, expert_output)


REPLICATED_ROUTING = ReplicatedRoutingDispatcher()
