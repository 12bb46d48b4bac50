"""EPLB: the placement policy, a rebalancing on a 2-rank gloo group under a skewed load, and an engine run.

* `balanced_placement` on a skewed load gives the hot expert the redundant slots and lowers the busiest
  rank's load, keeping every expert placed.
* On 2 ranks, `ExpertParallelExperts` with 2 redundant slots (6 slots, 3 per rank) and step_interval 3 sees
  routing skewed onto expert 3: after the third step its placement changes, every slot holds its new
  expert's weights (moved between the ranks), and every step's output equals fused_moe on one rank.
* An engine with EP and EPLB rebalancing every 4 steps gives transformers' greedy tokens and logprobs, and logs
  its new placements.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rapid_llm.distributed.eplb import ExpertPlacement, balanced_placement, rank_loads
from tests.distributed.golden import assert_matches_transformers
from tests.distributed.expert_weights import EXPERTS, HIDDEN, INTERMEDIATE, expert_tensors, load_experts
from tests.distributed.ranks import run_on_ranks

REDUNDANT = 2
TOLERANCE = 1e-5


def test_skewed_load_moves_redundant_slots_to_the_hot_expert() -> None:
    load = torch.tensor([2, 3, 1, 90])
    initial = ExpertPlacement.initial(EXPERTS, EXPERTS + REDUNDANT)
    placement = ExpertPlacement(balanced_placement(load, EXPERTS + REDUNDANT, 2, initial.physical_to_logical),
                                EXPERTS)
    assert placement.replica_counts.tolist() == [1, 1, 1, 3]
    assert max(rank_loads(load, placement, 2)) < max(rank_loads(load, initial, 2))
    # Expert 3 on both ranks; each rank kept the slots of the experts it still holds.
    assert placement.physical_to_logical.view(2, 3).eq(3).any(dim=1).all()
    kept = placement.physical_to_logical == initial.physical_to_logical
    assert kept.sum() >= 2


def test_replicas_share_the_pairs() -> None:
    placement = ExpertPlacement(torch.tensor([3, 0, 1, 3, 2, 3]), EXPERTS)
    slots = placement.choose(torch.full((3, 2), 3), first_pair=0)
    assert sorted(slots.flatten().tolist()) == [0, 0, 3, 3, 5, 5]


def _rebalance(t: dict[str, torch.Tensor]) -> dict[str, object]:
    from rapid_llm.config.eplb_config import EPLBConfig
    from rapid_llm.distributed import get_tp_rank, tp_all_reduce
    from rapid_llm.distributed.expert_parallel import ExpertParallelLayout
    from rapid_llm.layers.moe.ep_experts import ExpertParallelExperts
    from rapid_llm.ops.moe import fused_moe

    rank = get_tp_rank()
    layout = ExpertParallelLayout(EPLBConfig(num_redundant_experts=REDUNDANT, window_size=4, step_interval=3))
    experts = ExpertParallelExperts(EXPERTS, HIDDEN, INTERMEDIATE, layout)
    w13 = load_experts(experts, t)
    ids = torch.tensor([[3, 0], [3, 1], [3, 2], [0, 3], [3, 1], [2, 3]])
    initial = experts.placement.physical_to_logical.tolist()
    errors = []
    with torch.inference_mode():
        for _ in range(4):
            output = tp_all_reduce(experts(t["x"], t["w"], ids))
            expected = fused_moe(t["x"], t["w"], ids, w13, t["down"])
            errors.append(((output - expected).abs().max() / expected.abs().max()).item())
    held = experts.placement.physical_to_logical[rank * 3:(rank + 1) * 3]
    weight_error = max((experts.w13_weight[slot] - w13[expert]).abs().max().item() for slot, expert in
                       enumerate(held.tolist()))
    return {"initial": initial, "final": experts.placement.physical_to_logical.tolist(), "errors": errors,
            "weight_error": weight_error}


@pytest.fixture(scope="module")
def rebalanced(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    directory: Path = tmp_path_factory.mktemp("eplb")
    return run_on_ranks(_rebalance, 2, directory, expert_tensors(1, 6))


def test_skewed_load_changes_placement_on_every_rank(rebalanced) -> None:
    first, second = rebalanced
    assert first["final"] == second["final"] != first["initial"]
    assert first["final"].count(3) == 3  # the hot expert got both redundant slots


def test_outputs_and_weights_survive_the_rebalancing(rebalanced) -> None:
    for result in rebalanced:
        assert max(result["errors"]) <= TOLERANCE
        assert result["weight_error"] == 0.0


def test_engine_with_eplb_keeps_greedy_tokens(tiny_checkpoint, capfd) -> None:
    """Greedy tokens and logprobs are transformers' (= one rank's, test_ep_golden.py) across the rebalancings."""
    assert_matches_transformers(tiny_checkpoint("Qwen2MoeForCausalLM"), 2, "EP=2 + EPLB", enable_expert_parallel=True,
                                enable_eplb=True,
                                eplb_config={"num_redundant_experts": 2, "window_size": 8, "step_interval": 4})
    assert "EPLB step" in capfd.readouterr().err
