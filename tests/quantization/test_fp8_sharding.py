"""Each shard's FP8 scales land in the rows (or tiles) of its weight rows: merged q/k/v and gate/up layers and
row-parallel layers on every tensor-parallel rank, per format; a tile split between shards is refused."""

from __future__ import annotations

import pytest
import torch

from rapid_llm.layers import linear
from rapid_llm.quantization.fp8_config import Fp8Config
from rapid_llm.quantization.fp8_linear import Fp8LinearMethod
from rapid_llm.quantization.fp8_math import dequantize_weight, quantize_weight

TP = 2
FORMATS = {"tensor": Fp8Config("tensor", None, "dynamic"), "row": Fp8Config("row", None, "dynamic"),
           "block32": Fp8Config("block", (32, 32), "dynamic")}


def _checkpoint_matrix(rows: int, cols: int, config: Fp8Config, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One checkpoint matrix's tensors (weight + scales, named as in a checkpoint) and its dequantized value.
    Scales vary by a factor of 16 over the rows, so a scale in the wrong rows shows."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=generator) * torch.logspace(-2, 2, rows, base=2).unsqueeze(1)
    q, scale = quantize_weight(w, config.block, per_row=config.granularity == "row")
    name = "weight_scale_inv" if config.block else "weight_scale"
    return {"weight": q, name: scale.reshape(()) if config.granularity == "tensor" else scale}, \
        dequantize_weight(q, scale, config.block, torch.float32)


def _load(layer: linear.LinearBase, tensors: dict[str, torch.Tensor], shard_id: object) -> None:
    params = dict(layer.named_parameters())
    for name, tensor in tensors.items():
        params[name].weight_loader(params[name], tensor, shard_id)


def _dequantized(layer: linear.LinearBase) -> torch.Tensor:
    layer.prepare_weights()
    return dequantize_weight(layer.weight, layer.kernel.scale, layer.kernel.spec.block, torch.float32)


@pytest.fixture(params=range(TP))
def rank(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(linear, "get_tp_rank", lambda: request.param)
    monkeypatch.setattr(linear, "get_tp_size", lambda: TP)
    return request.param


# (layer, its (shard id, checkpoint rows) in order, checkpoint columns): q/k/v by head (8 query and 4 KV heads
# of 16), gate/up with 40 inputs (a partial column tile).
MERGED = {
    "qkv": (lambda: linear.QKVParallelLinear(64, head_dim=16, num_heads=8, num_kv_heads=4),
            (("q", 128), ("k", 64), ("v", 64)), 64),
    "gate_up": (lambda: linear.MergedColumnParallelLinear(40, [128, 128]), ((0, 128), (1, 128)), 40),
}


@pytest.mark.parametrize("merged", MERGED)
@pytest.mark.parametrize("name", FORMATS)
def test_merged_shards_scales_on_each_rank(rank: int, name: str, merged: str) -> None:
    config, (build, shards, cols) = FORMATS[name], MERGED[merged]
    layer = build()
    layer.set_linear_method(Fp8LinearMethod(config))
    expected = []
    for seed, (shard, rows) in enumerate(shards):
        tensors, full = _checkpoint_matrix(rows, cols, config, seed)
        _load(layer, tensors, shard)
        expected.append(full.chunk(TP)[rank])
    torch.testing.assert_close(_dequantized(layer), torch.cat(expected), rtol=0, atol=0)


@pytest.mark.parametrize("name", FORMATS)
def test_row_parallel_splits_block_scales_by_input_column(rank: int, name: str) -> None:
    config = FORMATS[name]
    layer = linear.RowParallelLinear(128, 72)  # 72 outputs: a partial row tile
    layer.set_linear_method(Fp8LinearMethod(config))
    tensors, full = _checkpoint_matrix(72, 128, config, 20)
    _load(layer, tensors, None)
    torch.testing.assert_close(_dequantized(layer), full.chunk(TP, dim=1)[rank], rtol=0, atol=0)


def test_a_tile_split_between_shards_is_refused(rank: int) -> None:
    layer = linear.MergedColumnParallelLinear(64, [96, 96])  # 48 rows per shard and rank: 32-row tiles split
    with pytest.raises(ValueError, match="not a multiple of the FP8 block's 32 rows"):
        layer.set_linear_method(Fp8LinearMethod(FORMATS["block32"]))
