"""quantized_fused_moe torch_ref equals fused_moe's loop over the dequantized experts bit for bit (FP8 with its
activations fake-quantized the same way), on the op cases' inputs, without ever storing the dequantized weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rapid_llm.ops.moe import expert_loop
from rapid_llm.ops.op_case_inputs import SHAPES, CaseConfig
from rapid_llm.ops.op_cases import OP_CASES
from rapid_llm.ops.quant_moe import ExpertScales, quantized_fused_moe
from rapid_llm.quantization.fp4_math import mxfp4_dequantize, nvfp4_dequantize
from rapid_llm.quantization.fp8_math import dequantize_weight, fake_quantize_activation


def _dequantized(weight: torch.Tensor, scales: ExpertScales, dtype: torch.dtype) -> torch.Tensor:
    scale, weight_global, _ = (scales.tensors + (None,))[:3]
    if weight.dtype == torch.float8_e4m3fn:
        return torch.stack([dequantize_weight(w, s, scales.spec.block, dtype) for w, s in zip(weight, scale)])
    if scales.spec.fmt == "mxfp4":
        return mxfp4_dequantize(weight, scale, dtype)
    return torch.stack([nvfp4_dequantize(w, s, g, dtype) for w, s, g in zip(weight, scale, weight_global)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", OP_CASES["quantized_fused_moe"].variants)
def test_quantized_fused_moe_is_dequantize_then_fused_moe(variant: str, dtype: torch.dtype) -> None:
    config = CaseConfig(SHAPES["tiny"], 9, dtype, torch.device("cpu"), seed=3)
    args = OP_CASES["quantized_fused_moe"].build(config, variant).args
    x, topk_weights, topk_ids, w13, w2, w13_scales, w2_scales = args
    spec = w13_scales.spec

    def linear(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if variant.startswith("fp8"):
            rows = fake_quantize_activation(rows, spec.activation_group, None, spec.ue8m0)
        return F.linear(rows, weight)

    expected = expert_loop(x, topk_weights, topk_ids, _dequantized(w13, w13_scales, dtype),
                           _dequantized(w2, w2_scales, dtype), None, linear)
    assert torch.equal(quantized_fused_moe(*args), expected)
