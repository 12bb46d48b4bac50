"""Fp4LinearMethod: NVFP4 or MXFP4 weights in any linear layer, loaded from three checkpoint layouts or online.

Tensors per linear layer (in = input features; two e2m1 codes per byte, even element in the low nibble):
- ModelOpt NVFP4: `weight` uint8 [out, in/2], `weight_scale` fp8 [out, in/16], `weight_scale_2` fp32 scalar and
  `input_scale` fp32 scalar (dequantization scales, amax / (448 * 6)).
- compressed-tensors NVFP4: `weight_packed`, `weight_scale` as above, `weight_global_scale` and, for W4A4,
  `input_global_scale` [1]: the reciprocals of ModelOpt's scalars.
- gpt-oss MXFP4: `weight_blocks` uint8 [out, in/32, 16] and `weight_scales` uint8 e8m0 [out, in/32].
Merged layers (qkv, gate_up) keep each matrix's per-tensor scale as one per row of the merged weight; W4A4 uses
the largest input scale of the merged matrices (every shard sees the same x). `prepare` leaves `weight` the
packed bytes [out, in/2] and binds the group scales to the `fp4_linear` op.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.fp4_linear import Fp4LinearSpec
from rapid_llm.ops.linear_kernel import LinearKernel
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.fp4_config import Fp4Config
from rapid_llm.quantization.fp4_math import mxfp4_quantize, nvfp4_quantize
from rapid_llm.quantization.fp8_linear import _is_row_parallel, _load_shard_scalar, rows_of_shard_scales
from rapid_llm.quantization.linear_method import LinearMethod, set_parameter

# layout -> (packed weight, group scales, per-tensor weight scale, per-tensor input scale) tensor names
TENSOR_NAMES = {
    "modelopt": ("weight", "weight_scale", "weight_scale_2", "input_scale"),
    "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"),
    "gpt-oss": ("weight_blocks", "weight_scales", None, None),
}


class Fp4LinearKernel(LinearKernel):
    """The `fp4_linear` implementation bound to one layer's scales (the layer passes its packed weight)."""

    def __init__(self, fn: Any, spec: Fp4LinearSpec, scale: torch.Tensor, weight_global: torch.Tensor | None,
                 input_global: torch.Tensor | None) -> None:
        self.fn, self.spec, self.scale = fn, spec, scale
        self.weight_global, self.input_global = weight_global, input_global

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.fn(x, weight, self.scale, self.weight_global, self.input_global, self.spec, bias)


def _load_split(layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    """A tensor with one entry per output row (dim 0) and a column dimension split like the input (dim 1)."""
    if _is_row_parallel(layer):
        copy_weight(param.data, loaded.narrow(1, layer.tp_rank * param.shape[1], param.shape[1]))
        return
    start, rows, source = layer.output_slice(shard_id)
    copy_weight(param.data.narrow(0, start, rows), loaded.narrow(0, source, rows))


class Fp4LinearMethod(LinearMethod):
    def __init__(self, config: Fp4Config) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module) -> None:
        layer.params_dtype = layer.weight.dtype  # the model dtype: activations and dequantized weights
        config, (out_features, in_features) = self.config, layer.weight.shape
        if in_features % config.group_size:
            raise ValueError(f"its {in_features} input features (per tensor-parallel rank) are not a multiple of "
                             f"{config.fmt}'s {config.group_size}-element groups")
        if config.online:
            return  # the model-dtype weight loads as usual; prepare quantizes it
        device, shards = layer.weight.device, len(layer.shard_ids())
        packed, scale, weight_global, input_global = TENSOR_NAMES[config.layout]
        groups = in_features // config.group_size
        if packed != "weight":
            # The logical shape stays readable (output_slice uses it); the packed bytes load under their own name.
            del layer.weight
            layer.weight = torch.empty(out_features, in_features, device="meta")
        packed_shape = (out_features, groups, 16) if config.layout == "gpt-oss" else (out_features, in_features // 2)
        set_parameter(layer, packed, torch.empty(packed_shape, dtype=torch.uint8, device=device),
                      partial(_load_split, layer))
        scale_dtype = torch.float8_e4m3fn if config.fmt == "nvfp4" else torch.uint8
        set_parameter(layer, scale, torch.empty(out_features, groups, dtype=scale_dtype, device=device),
                      partial(_load_split, layer))
        fp32 = {"dtype": torch.float32, "device": device}
        if weight_global is not None:
            set_parameter(layer, weight_global, torch.empty(shards, **fp32),
                          partial(_load_shard_scalar, layer))
        if config.activation == "nvfp4":
            set_parameter(layer, input_global, torch.empty(shards, **fp32),
                          partial(_load_shard_scalar, layer))

    def prepare(self, layer: nn.Module) -> None:
        config = self.config
        weight_global = input_global = None
        if config.online:
            weight = layer.weight.data
            if config.fmt == "nvfp4":
                packed, scale, weight_global = nvfp4_quantize(weight)
                weight_global = weight_global.reshape(1, 1)
            else:
                packed, scale = mxfp4_quantize(weight)
        else:
            names = TENSOR_NAMES[config.layout]
            packed, scale = getattr(layer, names[0]).data.flatten(1), getattr(layer, names[1]).data
            if names[2] is not None:
                weight_global = rows_of_shard_scales(layer, self._dequantization_scales(layer, names[2]))
            if config.activation == "nvfp4":
                # One scale for the merged input: the largest, so no shard's activations saturate.
                input_global = self._dequantization_scales(layer, names[3]).max()
            for name in names:
                if name is not None and name in layer._parameters:
                    delattr(layer, name)
        set_parameter(layer, "weight", packed)
        set_parameter(layer, "weight_scale", scale)
        spec = Fp4LinearSpec(config.fmt, config.activation)
        fn = REGISTRY.select("fp4_linear", packed.device, layer.params_dtype).fn
        layer.kernel = Fp4LinearKernel(fn, spec, scale, weight_global, input_global)

    def _dequantization_scales(self, layer: nn.Module, name: str) -> torch.Tensor:
        return dequantization_scales(self.config, getattr(layer, name).data)


def dequantization_scales(config: Fp4Config, stored: torch.Tensor) -> torch.Tensor:
    """Per-matrix scalars as dequantization scales (compressed-tensors stores the reciprocal)."""
    return 1.0 / stored if config.layout == "compressed-tensors" else stored
