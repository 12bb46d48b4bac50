"""Fp8MoEMethod: FP8 e4m3 routed experts (per-tensor, per-row or block scales), from a checkpoint or online.

Per expert matrix a checkpoint stores what the FP8 linear method reads (DeepSeek-V3 / Qwen3-FP8 names):
`experts.{e}.<proj>.weight` fp8 plus `weight_scale_inv` [ceil(out/bn), ceil(in/bk)] (block; compressed-tensors:
`weight_scale`), `weight_scale` [out, 1] (per row) or a scalar (per tensor), and `input_scale` (static).
Stacked: `w13_weight` fp8 [E, 2I, H] with gate's scale rows then up's (block scales need I to be a multiple
of bn, so no tile spans both), `w2_weight` [E, H, I]. Online, the model-dtype experts load and each expert's
w13 and w2 are quantized like a merged linear weight. Activations are quantized as for the dense layers.
"""

from __future__ import annotations

import torch

from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.ops.quant_moe import ExpertScales, QuantizedMoEKernel
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.fp8_config import Fp8Config
from rapid_llm.quantization.fp8_linear import _ceil, check_ue8m0, fp8_spec
from rapid_llm.quantization.fp8_math import FP8_DTYPE, quantize_weight
from rapid_llm.quantization.linear_method import set_parameter
from rapid_llm.quantization.moe_method import (
    PROJECTIONS,
    MoEMethod,
    add_rows,
    add_scalars,
    projection_shape,
    rows_of_scalars,
)


class Fp8MoEMethod(MoEMethod):
    def __init__(self, config: Fp8Config) -> None:
        self.config = config
        self.scale_name = config.block_scale_name if config.block is not None else "weight_scale"
        self.checkpoint_suffixes = (self.scale_name,) + (("input_scale",) if config.activation == "static" else ())

    def create_weights(self, experts: FusedExperts) -> None:
        experts.params_dtype = experts.w13_weight.dtype  # the model dtype: activations and dequantized weights
        config = self.config
        if config.block is not None and experts.intermediate_size % config.block[0]:
            raise ValueError(f"moe_intermediate_size {experts.intermediate_size} is not a multiple of the FP8 "
                             f"block's {config.block[0]} rows, so gate's and up's block scales would share a tile")
        if config.online:
            return  # the model-dtype experts load as usual; prepare quantizes them
        for projection in PROJECTIONS:
            rows, columns = projection_shape(experts, projection)
            set_parameter(experts, f"{projection}_weight",
                          torch.empty(experts.num_experts, rows, columns, dtype=FP8_DTYPE,
                                      device=experts.w13_weight.device), experts.weight_loader)
            name = f"{projection}_{self.scale_name}"
            if config.block is not None:
                bn, bk = config.block
                add_rows(experts, name, (_ceil(rows, bn), _ceil(columns, bk)), torch.float32, rows_per_entry=bn)
            elif config.granularity == "row":
                add_rows(experts, name, (rows, 1), torch.float32)
            else:
                add_scalars(experts, name, projection)
            if config.activation == "static":
                add_scalars(experts, f"{projection}_input_scale", projection)

    def _scales(self, experts: FusedExperts, projection: str) -> ExpertScales:
        config, weight = self.config, getattr(experts, f"{projection}_weight").data
        scale_name = f"{projection}_{self.scale_name}"
        if config.online:
            pairs = [quantize_weight(matrix, config.block, config.ue8m0, config.granularity == "row")
                     for matrix in weight]
            weight, scale = torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
            set_parameter(experts, f"{projection}_weight", weight)
        elif config.granularity == "tensor":
            scale = rows_of_scalars(experts, getattr(experts, scale_name).data, projection)
        else:
            scale = getattr(experts, scale_name).data
        check_ue8m0(config, scale)
        scale = set_parameter(experts, scale_name, scale)
        input_scale = None
        if config.activation == "static":
            # One scale per expert for its gate|up input (both see the same x): the larger, so neither saturates.
            input_scale = set_parameter(experts, f"{projection}_input_scale",
                                        getattr(experts, f"{projection}_input_scale").data.amax(dim=1))
        fn = REGISTRY.select("fp8_linear", weight.device, experts.params_dtype).fn
        return ExpertScales(fn, (scale, input_scale), fp8_spec(config))

    def prepare(self, experts: FusedExperts) -> None:
        w13, w2 = (self._scales(experts, projection) for projection in PROJECTIONS)
        fn = REGISTRY.select("quantized_fused_moe", experts.w13_weight.device, experts.params_dtype).fn
        experts.kernel = QuantizedMoEKernel(fn, w13, w2)
