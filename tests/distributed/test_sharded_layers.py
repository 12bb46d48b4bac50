"""Tensor-parallel layers on a 2-rank gloo group against the unsharded computation in plain torch.

Every rank builds the sharded layer, loads the full checkpoint tensors through its `weight_loader` (what
the model loader does), and runs the same input; its output (or its slice, for column-parallel layers)
must equal F.linear / F.embedding on the full weights. fp32; the row-parallel all-reduce only reorders
one sum, so 1e-5 (relative to the output's scale) covers it. One spawn serves every case (a rank start costs
seconds); each case is its own test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.distributed.ranks import run_on_ranks

WORLD_SIZE = 2
TOLERANCE = 1e-5
TOKENS, HIDDEN, HEAD_DIM, HEADS = 5, 16, 4, 4


def _reference_tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    return {
        "x": rand(TOKENS, HIDDEN), "w_col": rand(24, HIDDEN), "b_col": rand(24),
        "w_gate": rand(20, HIDDEN), "w_up": rand(20, HIDDEN),
        "w_q": rand(HEADS * HEAD_DIM, HIDDEN), "b_q": rand(HEADS * HEAD_DIM),
        "w_k2": rand(2 * HEAD_DIM, HIDDEN), "w_v2": rand(2 * HEAD_DIM, HIDDEN),
        "w_k1": rand(HEAD_DIM, HIDDEN), "w_v1": rand(HEAD_DIM, HIDDEN),
        "x_row": rand(TOKENS, 24), "w_row": rand(HIDDEN, 24), "b_row": rand(HIDDEN),
        # 11 rows over 2 ranks: 6 each, the last rank's sixth row is padding.
        "w_vocab": rand(11, HIDDEN), "ids": torch.tensor([0, 5, 6, 10, 3, 7]),
        "w_down": rand(HIDDEN, 20),
    }


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| relative to the largest |expected| (at least 1): the random weights give outputs
    in the hundreds, where fp32 rounding alone is ~1e-5 absolute."""
    if actual.shape != expected.shape:
        return float("inf")
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1)).item()


def _check_layers(t: dict[str, torch.Tensor]) -> dict[str, float]:
    """On each rank: the largest |sharded - unsharded| per case."""
    from rapid_llm.distributed import get_tp_rank, tp_broadcast, world_min
    from rapid_llm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
    from rapid_llm.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear,
                                         RowParallelLinear)
    from rapid_llm.layers.mlp import GatedMLP

    rank = get_tp_rank()

    def load(layer, name: str, tensor: torch.Tensor, shard_id=None):
        parameter = getattr(layer, name)
        parameter.weight_loader(parameter, tensor, shard_id)

    def half(tensor: torch.Tensor, dim: int = -1, parts: int = WORLD_SIZE, index: int = rank) -> torch.Tensor:
        return tensor.chunk(parts, dim=dim)[index]

    errors: dict[str, float] = {}
    x = t["x"]
    with torch.inference_mode():
        column = ColumnParallelLinear(HIDDEN, 24, bias=True)
        load(column, "weight", t["w_col"])
        load(column, "bias", t["b_col"])
        column.prepare_weights()
        errors["column"] = _max_error(column(x), half(F.linear(x, t["w_col"], t["b_col"])))

        merged = MergedColumnParallelLinear(HIDDEN, [20, 20])
        load(merged, "weight", t["w_gate"], 0)
        load(merged, "weight", t["w_up"], 1)
        merged.prepare_weights()
        expected = torch.cat([half(x @ t["w_gate"].T), half(x @ t["w_up"].T)], dim=-1)
        errors["merged_gate_up"] = _max_error(merged(x), expected)

        for kv_heads in (2, 1):
            qkv = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, kv_heads, bias=False)
            w_k, w_v = t[f"w_k{kv_heads}"], t[f"w_v{kv_heads}"]
            for shard, tensor in (("q", t["w_q"]), ("k", w_k), ("v", w_v)):
                load(qkv, "weight", tensor, shard)
            qkv.prepare_weights()
            # With one KV head both ranks hold all of it (replicated); with two each holds one.
            kv_index, kv_parts = (rank, WORLD_SIZE) if kv_heads >= WORLD_SIZE else (0, 1)
            expected = torch.cat([half(x @ t["w_q"].T), half(x @ w_k.T, parts=kv_parts, index=kv_index),
                                  half(x @ w_v.T, parts=kv_parts, index=kv_index)], dim=-1)
            errors[f"qkv_{kv_heads}_kv_heads"] = _max_error(qkv(x), expected)

        row = RowParallelLinear(24, HIDDEN, bias=True)
        load(row, "weight", t["w_row"])
        load(row, "bias", t["b_row"])
        row.prepare_weights()
        errors["row_all_reduce"] = _max_error(row(half(t["x_row"])), F.linear(t["x_row"], t["w_row"], t["b_row"]))

        embedding = VocabParallelEmbedding(11, HIDDEN)
        load(embedding, "weight", t["w_vocab"])
        errors["vocab_embedding_padded"] = _max_error(embedding(t["ids"]), F.embedding(t["ids"], t["w_vocab"]))

        head = ParallelLMHead(11, HIDDEN)
        load(head, "weight", t["w_vocab"])
        head.prepare_weights()
        errors["lm_head_gathered_padded"] = _max_error(head.compute_logits(x), x @ t["w_vocab"].T)

        mlp = GatedMLP(HIDDEN, 20)
        load(mlp.gate_up_proj, "weight", t["w_gate"], 0)
        load(mlp.gate_up_proj, "weight", t["w_up"], 1)
        load(mlp.down_proj, "weight", t["w_down"])
        for module in (mlp.gate_up_proj, mlp.down_proj):
            module.prepare_weights()
        expected = (F.silu(x @ t["w_gate"].T) * (x @ t["w_up"].T)) @ t["w_down"].T
        errors["gated_mlp"] = _max_error(mlp(x), expected)

        tokens = tp_broadcast(torch.tensor([10 + rank, 20 + rank]))
        errors["broadcast_from_rank0"] = _max_error(tokens.float(), torch.tensor([10.0, 20.0]))
        errors["min_over_ranks"] = float(world_min(7 - rank) != 6)
    return errors


CASES = ("column", "merged_gate_up", "qkv_2_kv_heads", "qkv_1_kv_heads", "row_all_reduce", "vocab_embedding_padded",
         "lm_head_gathered_padded", "gated_mlp", "broadcast_from_rank0", "min_over_ranks")


@pytest.fixture(scope="module")
def rank_errors(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    directory: Path = tmp_path_factory.mktemp("tp-layers")
    return run_on_ranks(_check_layers, WORLD_SIZE, directory, _reference_tensors())


@pytest.mark.parametrize("case", CASES)
def test_sharded_layer_matches_unsharded(rank_errors: list[dict[str, float]], case: str) -> None:
    assert all(errors[case] <= TOLERANCE for errors in rank_errors), [errors[case] for errors in rank_errors]


