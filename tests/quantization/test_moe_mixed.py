"""Mixed precision end to end on the packaged MoE demo model: dense layers FP8 block 32x32 with ue8m0 scales, experts
as `quantization_config.expert_dtype` says (DeepSeek-V4's "fp4", ModelOpt-named "nvfp4", or "bf16"), written from
known tensors; logits match transformers with the dequantized weights (fake-quantized dense inputs), greedy tokens
equal its generate, and the experts' stored bytes are the format's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.demo_checkpoint import demo_model_dir
from tests.hf_reference import hf_greedy
from tests.models.paged_generation import generate
from tests.quantization.fp4_reference import modelopt_nvfp4
from tests.quantization.fp8_reference import Format
from tests.quantization.moe_reference import deepseek_fp4, fp8_quantizer, reference_model, write_moe_checkpoint
from tests.quantization.test_fp8_checkpoints import LOGIT_ATOL, PROMPTS, _max_error, _runner

DENSE = Format("block", (32, 32), ue8m0=True)
EXPERTS = {"fp4": deepseek_fp4, "nvfp4": modelopt_nvfp4, "bf16": lambda w: ({"weight": w}, w.float())}
NEW_TOKENS = 12


def _expert_bytes(expert_dtype: str, rows: int, columns: int) -> int:
    """Bytes one expert matrix [rows, columns] is stored in, in an fp32 model."""
    if expert_dtype == "fp4":  # MXFP4: e2m1 codes, one e8m0 byte per 32
        return rows * columns // 2 + rows * columns // 32
    if expert_dtype == "nvfp4":  # e2m1 codes, an fp8 scale per 16, the matrix's fp32 global scale held per row
        return rows * columns // 2 + rows * columns // 16 + rows * 4
    return rows * columns * 4


# ~20 s each on 2 cores (the reference's per-group fake quantization, torch_ref's per-call dequantization): the
# DeepSeek-V4 spelling runs by default, the others with the slow tests.
@pytest.mark.parametrize("expert_dtype", ["fp4", pytest.param("nvfp4", marks=pytest.mark.slow),
                                          pytest.param("bf16", marks=pytest.mark.slow)])
def test_mixed_dense_fp8_and_expert_dtype_on_the_demo_model(tmp_path: Path, expert_dtype: str) -> None:
    source = demo_model_dir("demo-moe")
    config = {**DENSE.quantization_config(), "expert_dtype": expert_dtype}
    weights = write_moe_checkpoint(source, tmp_path / "mixed", EXPERTS[expert_dtype], config,
                                   dense=fp8_quantizer(DENSE))
    runner = _runner(tmp_path / "mixed", dtype="float32")
    layer = runner.model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    experts = layer.mlp.experts
    assert experts.w13_weight.dtype == (torch.float32 if expert_dtype == "bf16" else torch.uint8)
    e, h, i = experts.num_experts, experts.hidden_size, experts.intermediate_size
    assert sum(p.numel() * p.element_size() for p in experts.parameters()) == \
        e * (_expert_bytes(expert_dtype, 2 * i, h) + _expert_bytes(expert_dtype, h, i))
    reference = reference_model(source, weights, DENSE)
    error = _max_error(runner, reference)
    print(f"dense fp8 block32 ue8m0 + experts {expert_dtype}: max |logit error| {error:.2e}")
    assert error <= LOGIT_ATOL
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    ours = [sequence.output for sequence in generate(runner, list(PROMPTS), params)]
    assert ours == hf_greedy(reference, PROMPTS, NEW_TOKENS)
