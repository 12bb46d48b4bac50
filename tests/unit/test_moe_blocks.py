"""SparseMoeBlock in each model's configuration against transformers' own MoE module with the same random
weights: Mixtral, Qwen2-MoE (gated shared expert), Qwen3-MoE, DeepSeek-V2 (plain shared experts, softmax,
group-limited) and DeepSeek-V3 (sigmoid + e_score_correction_bias, groups, routed scaling, shared experts;
the block the DeepSeek models use), in fp32 and bf16."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest
import torch
import transformers
from torch import nn
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from rapid_llm.layers.moe import RouterConfig, SparseMoeBlock
from rapid_llm.model_loader.loader import default_dtype
from tests.op_pins import pinned_backends

HIDDEN, INTERMEDIATE, SHARED, EXPERTS, TOKENS = 32, 24, 40, 8, 17
TOLERANCES = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
COMMON = {"hidden_size": HIDDEN, "moe_intermediate_size": INTERMEDIATE, "num_experts_per_tok": 3}


def _mixtral():
    config = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_local_experts=EXPERTS,
                                        num_experts_per_tok=2)
    return MixtralSparseMoeBlock(_eager(config)), lambda: SparseMoeBlock(HIDDEN, INTERMEDIATE,
                                                                         RouterConfig.mixtral(config))


def _qwen2_moe():
    config = transformers.Qwen2MoeConfig(num_experts=EXPERTS, shared_expert_intermediate_size=SHARED, **COMMON)
    return Qwen2MoeSparseMoeBlock(_eager(config)), lambda: SparseMoeBlock(
        HIDDEN, INTERMEDIATE, RouterConfig.qwen_moe(config), shared_intermediate_size=SHARED, shared_expert_gate=True)


def _qwen3_moe():
    config = transformers.Qwen3MoeConfig(num_experts=EXPERTS, norm_topk_prob=True, **COMMON)
    return Qwen3MoeSparseMoeBlock(_eager(config)), lambda: SparseMoeBlock(HIDDEN, INTERMEDIATE,
                                                                          RouterConfig.qwen_moe(config))


def _deepseek_v2():
    config = transformers.DeepseekV2Config(n_routed_experts=EXPERTS, n_shared_experts=2, topk_method="group_limited_greedy",
                                           n_group=4, topk_group=2, routed_scaling_factor=1.5, **COMMON)
    return DeepseekV2Moe(_eager(config)), lambda: SparseMoeBlock.deepseek(config, RouterConfig.deepseek_v2(config))


def _deepseek_v3():
    config = transformers.DeepseekV3Config(n_routed_experts=EXPERTS, n_shared_experts=1, n_group=4, topk_group=2,
                                           norm_topk_prob=True, routed_scaling_factor=2.5, **COMMON)
    return DeepseekV3MoE(_eager(config)), lambda: SparseMoeBlock.deepseek(config, RouterConfig.deepseek_v3(config))


BLOCKS: dict[str, Callable[[], tuple[nn.Module, Callable[[], SparseMoeBlock]]]] = {
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
}


def _eager(config: transformers.PretrainedConfig) -> transformers.PretrainedConfig:
    config._experts_implementation = "eager"  # the per-expert loop fused_moe transcribes
    return config


@pytest.fixture(autouse=True)
def reference_linear() -> Iterator[None]:
    """Both sides' GEMMs as F.linear: a bf16 router logit computed another way could flip an expert choice."""
    with pinned_backends({"linear": "torch_ref"}):
        yield


@torch.no_grad()
def _randomize(hf: nn.Module, dtype: torch.dtype) -> None:
    for name, tensor in [*hf.named_parameters(), *hf.named_buffers()]:
        tensor.normal_(std=1.0 if name.startswith("gate.") else 0.2)
    hf.to(dtype)
    if isinstance(hf, (DeepseekV2Moe, DeepseekV3MoE)):
        hf.gate.float()  # DeepSeek keeps the router in fp32 (_keep_in_fp32_modules_strict)


@torch.no_grad()
def _copy_weights(hf: nn.Module, ours: SparseMoeBlock) -> None:
    """HF's module names -> ours; every parameter of ours must be filled."""
    hf_params = dict([*hf.named_parameters(), *hf.named_buffers()])
    sources = {"gate.weight": hf_params["gate.weight"], "experts.w13_weight": hf_params["experts.gate_up_proj"],
               "experts.w2_weight": hf_params["experts.down_proj"]}
    for name in ("gate.e_score_correction_bias", "shared_expert_gate.weight"):
        if name in hf_params:
            sources[name] = hf_params[name]
    for shared in ("shared_expert", "shared_experts"):
        if f"{shared}.gate_proj.weight" in hf_params:
            sources[f"{shared}.gate_up_proj.weight"] = torch.cat(
                [hf_params[f"{shared}.gate_proj.weight"], hf_params[f"{shared}.up_proj.weight"]])
            sources[f"{shared}.down_proj.weight"] = hf_params[f"{shared}.down_proj.weight"]
    params = dict(ours.named_parameters())
    assert params.keys() == sources.keys()
    for name, source in sources.items():
        params[name].copy_(source)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("model", list(BLOCKS))
def test_sparse_block_matches_transformers(model: str, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    hf, make_ours = BLOCKS[model]()
    _randomize(hf, dtype)
    with default_dtype(dtype):
        ours = make_ours()
    _copy_weights(hf, ours)
    x = torch.randn(1, TOKENS, HIDDEN, dtype=dtype)
    with torch.no_grad():
        expected, out = hf(x)[0], ours(x[0])
    assert out.dtype == dtype
    # Not bit-exact: the GEMMs see the tokens in another row order, and gate/up are one GEMM here.
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


def test_deepseek_router_weights_stay_fp32_in_a_bf16_model() -> None:
    config = transformers.DeepseekV3Config(n_routed_experts=EXPERTS, n_group=4, topk_group=2, **COMMON)
    with default_dtype(torch.bfloat16):
        block = SparseMoeBlock.deepseek(config, RouterConfig.deepseek_v3(config))
    assert block.gate.weight.dtype == block.gate.e_score_correction_bias.dtype == torch.float32
    assert block.experts.w13_weight.dtype == block.shared_experts.down_proj.weight.dtype == torch.bfloat16


def test_a_shared_expert_gate_needs_a_shared_expert() -> None:
    with pytest.raises(ValueError, match="shared_expert_intermediate_size"):
        SparseMoeBlock(HIDDEN, INTERMEDIATE, RouterConfig(EXPERTS, 2), shared_expert_gate=True)
