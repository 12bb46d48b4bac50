"""How the decoder layers split into pipeline stages (config/parallel_config.py `layer_partition`, read by
distributed/pipeline.py and models/pipeline_split.py) and what a stage skips of the checkpoint."""

from __future__ import annotations

import re

import pytest

from rapid_llm.config.parallel_config import ParallelConfig, layer_partition
from rapid_llm.distributed.pipeline import PipelineStage
from rapid_llm.models.pipeline_split import StageSplit


@pytest.mark.parametrize(("num_layers", "stages", "expected"), [
    (4, 2, (2, 2)), (5, 2, (2, 3)), (7, 3, (2, 2, 3)), (8, 3, (2, 3, 3)), (3, 3, (1, 1, 1))])
def test_an_even_split_puts_the_remainder_on_the_last_stages(num_layers: int, stages: int,
                                                             expected: tuple[int, ...]) -> None:
    assert layer_partition(num_layers, stages) == expected
    ranges = [PipelineStage(rank, stages).layers(num_layers) for rank in range(stages)]
    assert [len(layers) for layers in ranges] == list(expected)
    assert [i for layers in ranges for i in layers] == list(range(num_layers))


def test_an_explicit_partition_is_checked() -> None:
    assert layer_partition(6, 2, (1, 5)) == (1, 5)
    for bad in [(3, 2), (0, 6), (2, 2, 2)]:
        with pytest.raises(ValueError, match="--pp-layer-partition"):
            layer_partition(6, 2, bad)
    with pytest.raises(ValueError, match="fewer than the stages"):
        layer_partition(2, 3)


def test_the_layout_counts_every_stage() -> None:
    parallel = ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=3)
    assert (parallel.world_size, parallel.result_rank) == (6, 4)
    with pytest.raises(ValueError, match="--pp-layer-partition takes effect"):
        ParallelConfig(pp_layer_partition=(1, 1))
    two_nodes = ParallelConfig(pipeline_parallel_size=2, nnodes=2, node_rank=1, dist_init_addr="127.0.0.1:9000")
    assert (list(two_nodes.local_ranks), two_nodes.result_rank) == ([1], 1)  # node 1 runs the last stage
    with pytest.raises(ValueError, match="must divide the 3 ranks"):
        ParallelConfig(pipeline_parallel_size=3, nnodes=2, dist_init_addr="127.0.0.1:9000")


def test_a_stage_skips_the_other_stages_tensors() -> None:
    def skipped(split: StageSplit, name: str) -> bool:
        return any(re.fullmatch(entry.pattern, name) for entry in split.skipped_keys(4))

    first, last = StageSplit(range(0, 2), True, False, False), StageSplit(range(2, 4), False, True, True)
    assert not skipped(first, "model.layers.1.mlp.up_proj.weight")
    assert skipped(first, "model.layers.2.mlp.up_proj.weight")
    assert skipped(first, "lm_head.weight") and skipped(first, "model.norm.weight")
    assert not skipped(first, "model.embed_tokens.weight")
    assert not skipped(last, "model.embed_tokens.weight")  # tied: the head reads the embedding's weight
    assert skipped(StageSplit(range(2, 4), False, True, False), "model.embed_tokens.weight")
    assert StageSplit(range(0, 4), True, True, False).skipped_keys(4) == ()
