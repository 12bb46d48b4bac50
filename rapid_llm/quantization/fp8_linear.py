"""Fp8LinearMethod: FP8 e4m3 weights with per-tensor, per-row or block scales, in any linear layer.

From a checkpoint: `weight` fp8 [out, in] plus `weight_scale_inv` [ceil(out/bn), ceil(in/bk)] (block), or
`weight_scale` [out, 1] (row) / one scalar per checkpoint matrix (tensor), plus `input_scale` scalars for
static activations. Merged layers (qkv, gate_up) load each shard's scales into the rows of its weight rows:
block scales need every shard (and tensor-parallel slice) to start on a multiple of block_n rows, which is
checked when the weights are created. Online, the model-dtype weight loads as usual and `prepare` quantizes
it. Either way `prepare` leaves `weight` fp8 and one scale tensor, applied by the `fp8_linear` op.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.fp8_linear import Fp8LinearSpec
from rapid_llm.ops.linear_kernel import LinearKernel
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.fp8_config import Fp8Config
from rapid_llm.quantization.fp8_math import FP8_DTYPE, quantize_weight
from rapid_llm.quantization.linear_method import LinearMethod, set_parameter


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


def _is_row_parallel(layer: nn.Module) -> bool:
    return hasattr(layer, "input_slice")


class Fp8LinearKernel(LinearKernel):
    """The `fp8_linear` implementation bound to one layer's scales (the layer passes its fp8 weight)."""

    def __init__(self, fn: Any, spec: Fp8LinearSpec, scale: torch.Tensor, input_scale: torch.Tensor | None) -> None:
        self.fn, self.spec, self.scale, self.input_scale = fn, spec, scale, input_scale

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.fn(x, weight, self.scale, self.input_scale, self.spec, bias)


def _load_block_scale(layer: nn.Module, block: tuple[int, int], param: nn.Parameter, loaded: torch.Tensor,
                      shard_id: Any = None) -> None:
    if _is_row_parallel(layer):
        source, _ = layer.input_slice()
        copy_weight(param.data, loaded.narrow(1, source // block[1], param.shape[1]))
        return
    start, rows, source = layer.output_slice(shard_id)
    tiles = _ceil(rows, block[0])
    copy_weight(param.data.narrow(0, start // block[0], tiles), loaded.narrow(0, source // block[0], tiles))


def _load_row_scale(layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    if _is_row_parallel(layer):  # the output rows are not split there
        copy_weight(param.data, loaded.reshape(param.shape))
        return
    start, rows, source = layer.output_slice(shard_id)
    copy_weight(param.data.narrow(0, start, rows), loaded.reshape(-1, 1).narrow(0, source, rows))


def _load_shard_scalar(layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    if loaded.numel() != 1:
        raise ValueError(f"a per-tensor FP8 scale holds one value, got shape {tuple(loaded.shape)}")
    copy_weight(param.data[layer.shard_ids().index(shard_id)], loaded.reshape(()))


def check_block_alignment(layer: nn.Module, block: tuple[int, int]) -> None:
    """Refuse a layer whose shards or tensor-parallel slices would split a scale tile between two matrices."""
    if _is_row_parallel(layer):
        source, _ = layer.input_slice()
        if source % block[1]:
            raise ValueError(f"its tensor-parallel slice starts at input column {source}, not a multiple of the "
                             f"FP8 block's {block[1]} columns; use a tensor-parallel size that keeps tiles whole")
        return
    for shard_id in layer.shard_ids():
        start, _, source = layer.output_slice(shard_id)
        if start % block[0] or source % block[0]:
            where = f"shard {shard_id!r}" if shard_id is not None else "its weight"
            raise ValueError(f"{where} starts at row {start} of the merged weight (row {source} of the checkpoint "
                             f"matrix), not a multiple of the FP8 block's {block[0]} rows, so its block scales "
                             "cannot be placed; this checkpoint's shapes do not fit weight_block_size")


def rows_of_shard_scales(layer: nn.Module, scales: torch.Tensor) -> torch.Tensor:
    """Per-matrix scales [shards] -> one per output row [out, 1] (a merged layer's shards differ)."""
    if _is_row_parallel(layer):
        return scales.reshape(1, 1)
    rows = torch.empty(layer.weight.shape[0], 1, dtype=torch.float32, device=scales.device)
    for index, shard_id in enumerate(layer.shard_ids()):
        start, count, _ = layer.output_slice(shard_id)
        rows[start:start + count] = scales[index]
    return rows


class Fp8LinearMethod(LinearMethod):
    def __init__(self, config: Fp8Config) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module) -> None:
        layer.params_dtype = layer.weight.dtype  # the model dtype: activations and dequantized weights
        config = self.config
        if config.block is not None:
            check_block_alignment(layer, config.block)
        if config.online:
            return  # the model-dtype weight loads as usual; prepare quantizes it
        out_features, in_features = layer.weight.shape
        device, shards = layer.weight.device, len(layer.shard_ids())
        set_parameter(layer, "weight", torch.empty(out_features, in_features, dtype=FP8_DTYPE, device=device),
                      layer.weight_loader)
        fp32 = {"dtype": torch.float32, "device": device}
        if config.block is not None:
            tiles = (_ceil(out_features, config.block[0]), _ceil(in_features, config.block[1]))
            set_parameter(layer, config.block_scale_name, torch.empty(tiles, **fp32),
                          partial(_load_block_scale, layer, config.block))
        elif config.granularity == "row":
            set_parameter(layer, "weight_scale", torch.empty(out_features, 1, **fp32), partial(_load_row_scale, layer))
        else:
            set_parameter(layer, "weight_scale", torch.empty(shards, **fp32), partial(_load_shard_scalar, layer))
        if config.activation == "static":
            set_parameter(layer, "input_scale", torch.empty(shards, **fp32), partial(_load_shard_scalar, layer))

    def prepare(self, layer: nn.Module) -> None:
        config = self.config
        scale_name = config.block_scale_name if config.block is not None else "weight_scale"
        if config.online:
            weight, scale = quantize_weight(layer.weight.data, config.block, config.ue8m0, config.granularity == "row")
            set_parameter(layer, "weight", weight)
            set_parameter(layer, scale_name, scale)
        elif config.granularity == "tensor":
            set_parameter(layer, scale_name, rows_of_shard_scales(layer, layer.weight_scale.data))
        scale = getattr(layer, scale_name)
        check_ue8m0(config, scale)
        input_scale = None
        if config.activation == "static":
            # One scale for the merged input (every shard sees the same x): the largest, so none saturates.
            input_scale = layer.input_scale.data.max()
            set_parameter(layer, "input_scale", input_scale)
        fn = REGISTRY.select("fp8_linear", layer.weight.device, layer.params_dtype).fn
        layer.kernel = Fp8LinearKernel(fn, fp8_spec(config), scale, getattr(layer, "input_scale", None))


def check_ue8m0(config: Fp8Config, scale: torch.Tensor) -> None:
    if config.ue8m0 and not torch.equal(scale, torch.exp2(torch.round(torch.log2(scale)))):
        raise ValueError("quantization_config.scale_fmt is ue8m0, but its weight scales are not powers of two")


def fp8_spec(config: Fp8Config) -> Fp8LinearSpec:
    """The fp8_linear call a config's weights take (activations quantized as it says)."""
    return Fp8LinearSpec(config.block, config.activation == "static",
                         config.block[1] if config.block is not None else None, config.ue8m0,
                         config.activation_scale_ub)
