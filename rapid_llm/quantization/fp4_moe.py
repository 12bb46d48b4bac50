"""Fp4MoEMethod: NVFP4 or MXFP4 routed experts, from four per-expert checkpoint layouts or online.

Per expert matrix (in = its input features), the tensors the FP4 linear method reads, plus DeepSeek-V4's:
- ModelOpt NVFP4: `weight` uint8 [out, in/2], `weight_scale` fp8 [out, in/16], `weight_scale_2` scalar
  (and `input_scale` for W4A4); compressed-tensors: `weight_packed`, `weight_scale`, `weight_global_scale`
  (`input_global_scale`), the reciprocal scalars.
- gpt-oss MXFP4 names per expert: `weight_blocks` [out, in/32, 16], `weight_scales` e8m0 bytes [out, in/32].
  (gpt-oss's own fused `experts.gate_up_proj_blocks` is not read: no gpt-oss model is built here.)
- DeepSeek-V4 `expert_dtype: fp4` (layout "deepseek"): `weight` int8 [out, in/2] and `weight_scale_inv`
  [out, in/32] as float8_e8m0fnu or power-of-two fp32: MXFP4's numerics.
Per-matrix scalars become one per output row, so gate's and up's may differ; W4A4 takes each expert's larger
input scale. Online, each expert's w13 and w2 are quantized (NVFP4: one global scale per expert matrix).
"""

from __future__ import annotations

import torch

from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.ops.fp4_linear import Fp4LinearSpec
from rapid_llm.ops.quant_moe import ExpertScales, QuantizedMoEKernel
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.fp4_config import Fp4Config
from rapid_llm.quantization.fp4_linear import TENSOR_NAMES, dequantization_scales
from rapid_llm.quantization.fp4_math import mxfp4_quantize, nvfp4_quantize
from rapid_llm.quantization.linear_method import set_parameter
from rapid_llm.quantization.moe_method import (
    PROJECTIONS,
    MoEMethod,
    add_rows,
    add_scalars,
    as_bytes,
    drop_checkpoint_tensors,
    e8m0_bytes,
    projection_shape,
    rows_of_scalars,
)

EXPERT_TENSOR_NAMES = {**TENSOR_NAMES, "deepseek": ("weight", "weight_scale_inv", None, None)}


class Fp4MoEMethod(MoEMethod):
    def __init__(self, config: Fp4Config) -> None:
        self.config = config
        self.names = EXPERT_TENSOR_NAMES.get(config.layout, (None,) * 4)
        packed, scale, weight_global, input_global = self.names
        used = (packed, scale, weight_global, input_global if config.activation == "nvfp4" else None)
        self.checkpoint_suffixes = tuple(name for name in used if name not in (None, "weight"))

    def create_weights(self, experts: FusedExperts) -> None:
        experts.params_dtype = experts.w13_weight.dtype  # the model dtype: activations and dequantized weights
        config = self.config
        for projection in PROJECTIONS:
            columns = projection_shape(experts, projection)[1]
            if columns % config.group_size:
                raise ValueError(f"its {columns} input features ({projection}) are not a multiple of "
                                 f"{config.fmt}'s {config.group_size}-element groups")
        if config.online:
            return  # the model-dtype experts load as usual; prepare quantizes them
        packed, scale, weight_global, input_global = self.names
        for projection in PROJECTIONS:
            rows, columns = projection_shape(experts, projection)
            groups = columns // config.group_size
            if packed != "weight":
                delattr(experts, f"{projection}_weight")  # the packed bytes load under their own name
            shape = (rows, groups, 16) if config.layout == "gpt-oss" else (rows, columns // 2)
            add_rows(experts, f"{projection}_{packed}", shape, torch.uint8, convert=as_bytes)
            if config.fmt == "nvfp4":
                add_rows(experts, f"{projection}_{scale}", (rows, groups), torch.float8_e4m3fn)
            else:
                add_rows(experts, f"{projection}_{scale}", (rows, groups), torch.uint8, convert=e8m0_bytes)
            if weight_global is not None:
                add_scalars(experts, f"{projection}_{weight_global}", projection)
            if config.activation == "nvfp4":
                add_scalars(experts, f"{projection}_{input_global}", projection)

    def _quantized(self, experts: FusedExperts, projection: str) -> tuple[torch.Tensor, ...]:
        """(packed [E, rows, in/2], group scales, per-row global [E, rows, 1] or None, input global [E] or None)."""
        config = self.config
        if config.online and config.fmt == "mxfp4":
            return (*mxfp4_quantize(getattr(experts, f"{projection}_weight").data), None, None)
        if config.online:
            weight = getattr(experts, f"{projection}_weight").data
            triples = [nvfp4_quantize(matrix) for matrix in weight]
            return (torch.stack([t[0] for t in triples]), torch.stack([t[1] for t in triples]),
                    torch.stack([t[2] for t in triples]).reshape(-1, 1, 1), None)
        packed, scale, weight_global, input_global = (getattr(experts, f"{projection}_{name}", None)
                                                      for name in self.names)
        per_row = input_scale = None
        if weight_global is not None:
            per_row = rows_of_scalars(experts, dequantization_scales(config, weight_global.data), projection)
        if config.activation == "nvfp4":
            # One scale per expert for its merged input: the largest, so no matrix's activations saturate.
            input_scale = dequantization_scales(config, input_global.data).amax(dim=1)
        return packed.data.flatten(2), scale.data, per_row, input_scale

    def _scales(self, experts: FusedExperts, projection: str) -> ExpertScales:
        packed, scale, weight_global, input_global = self._quantized(experts, projection)
        drop_checkpoint_tensors(experts, [f"{projection}_{name}" for name in self.names if name is not None])
        set_parameter(experts, f"{projection}_weight", packed)
        tensors = tuple(None if tensor is None else set_parameter(experts, f"{projection}_{name}", tensor)
                        for name, tensor in (("weight_scale", scale), ("weight_global", weight_global),
                                             ("input_global", input_global)))
        fn = REGISTRY.select("fp4_linear", packed.device, experts.params_dtype).fn
        return ExpertScales(fn, tensors, Fp4LinearSpec(self.config.fmt, self.config.activation))

    def prepare(self, experts: FusedExperts) -> None:
        w13, w2 = (self._scales(experts, projection) for projection in PROJECTIONS)
        fn = REGISTRY.select("quantized_fused_moe", experts.w13_weight.device, experts.params_dtype).fn
        experts.kernel = QuantizedMoEKernel(fn, w13, w2)
