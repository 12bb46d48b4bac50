"""Expert-parallel dispatch/combine and the EP experts layer on a 2-rank gloo group, against fused_moe on one rank.

Every rank builds `ExpertParallelExperts` (4 experts, 2 slots per rank), loads the full checkpoint through its
`weight_loader` and runs the same routing; after the block's all-reduce its output must equal the reference
fused_moe over all experts. Routings are uneven on purpose: every pair to rank 0's experts (rank 1 receives
nothing), every pair to rank 1's, a single token (rank 1's share of the batch is empty) and an empty batch.
Both dispatchers serve the layer: the all-to-all and the replicated-routing one (no exchange). The raw dispatchers
are checked too: what each rank receives is exactly the pairs routed to its slots.
One spawn serves every case; fp32, 1e-5 relative.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.expert_weights import EXPERTS, HIDDEN, INTERMEDIATE, TOP_K, expert_tensors, load_experts
from tests.distributed.ranks import run_on_ranks

WORLD_SIZE = 2
TOLERANCE = 1e-5
# name -> expert ids [tokens, top_k]; experts 0, 1 live on rank 0 and 2, 3 on rank 1.
ROUTINGS = {
    "mixed": [[0, 3], [1, 2], [2, 0], [3, 1], [0, 1]],
    "all_to_rank0": [[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]],
    "all_to_rank1": [[3, 2], [2, 3], [3, 2]],
    "one_token": [[2, 1]],
    "no_tokens": [],
}


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.shape != expected.shape:
        return float("inf")
    if expected.numel() == 0:
        return 0.0
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1)).item()


def _check(t: dict[str, torch.Tensor]) -> dict[str, float]:
    from rapid_llm.distributed import get_tp_rank, tp_all_reduce
    from rapid_llm.distributed.expert_parallel import TORCH_ALL_TO_ALL, ExpertParallelLayout
    from rapid_llm.distributed.replicated_dispatch import REPLICATED_ROUTING
    from rapid_llm.layers.moe.ep_experts import ExpertParallelExperts
    from rapid_llm.ops.moe import fused_moe

    rank = get_tp_rank()
    experts = ExpertParallelExperts(EXPERTS, HIDDEN, INTERMEDIATE, ExpertParallelLayout())
    w13 = load_experts(experts, t)
    results = {"holds_its_experts": _relative_error(experts.w13_weight, w13[2 * rank:2 * rank + 2])}
    with torch.inference_mode():
        for label, dispatcher in (("all_to_all", TORCH_ALL_TO_ALL), ("replicated", REPLICATED_ROUTING)):
            experts.dispatcher = dispatcher
            for name, routing in ROUTINGS.items():
                ids = torch.tensor(routing, dtype=torch.int64).view(-1, TOP_K)
                x, weights = t["x"][:ids.shape[0]], t["w"][:ids.shape[0]]
                output = tp_all_reduce(experts(x, weights, ids))
                results[f"{label} {name}"] = _relative_error(output, fused_moe(x, weights, ids, w13, t["down"]))
                # The raw dispatch: this rank receives exactly the pairs routed to its two slots.
                start, end = dispatcher.token_range(ids.shape[0], rank, WORLD_SIZE)
                dispatched = dispatcher.dispatch(x[start:end], weights[start:end], ids[start:end], 2)
                expected_rows = int(((ids >= 2 * rank) & (ids < 2 * rank + 2)).sum())
                results[f"{label} {name}_received"] = float(dispatched.hidden.shape[0] != expected_rows
                                                            or bool((dispatched.local_slots >= 2).any()))
    return results


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    directory: Path = tmp_path_factory.mktemp("ep-all-to-all")
    return run_on_ranks(_check, WORLD_SIZE, directory, expert_tensors(0, 8))


@pytest.mark.parametrize("case", ["holds_its_experts", *(f"{label} {name}{suffix}" for label in ("all_to_all", "replicated")
                                                         for name in ROUTINGS for suffix in ("", "_received"))])
def test_expert_parallel_matches_one_rank(rank_results: list[dict[str, float]], case: str) -> None:
    assert all(results[case] <= TOLERANCE for results in rank_results), [results[case] for results in rank_results]
