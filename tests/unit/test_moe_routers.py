"""Every router preset against a direct transcription of transformers' routing code for that model
(Mixtral, Qwen2/3-MoE, DeepSeek-V2 greedy and group_limited_greedy, DeepSeek-V3 noaux_tc, DeepSeek-V4's
sqrtsoftplus top-k and hash routers), on random
logits and on logits drawn from a coarse grid, so ties between experts and between groups are common."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from transformers.activations import ACT2FN

from rapid_llm.layers.moe import RouterConfig, select_experts
from rapid_llm.layers.moe.router import hashed_experts

TOKENS = 64


def _group_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """transformers' [T, E] mask of the experts in each token's topk_group best groups."""
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    num_groups = group_scores.shape[1]
    return mask.unsqueeze(-1).expand(-1, num_groups, num_experts // num_groups).reshape(-1, num_experts).bool()


def hf_softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool, cast_back: bool):
    """MixtralTopKRouter (renormalize, no cast back) and Qwen2/3MoeTopKRouter (norm_topk_prob, cast back)."""
    probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
    values, indices = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        values = values / values.sum(dim=-1, keepdim=True)
    return (values.to(logits.dtype) if cast_back else values), indices


def hf_deepseek_v2(logits: torch.Tensor, config: transformers.DeepseekV2Config):
    num_experts = config.n_routed_experts
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    if config.topk_method == "group_limited_greedy":
        group_scores = scores.view(-1, config.n_group, num_experts // config.n_group).max(dim=-1).values
        scores = scores.masked_fill(~_group_mask(group_scores, config.topk_group, num_experts), 0.0)
    weights, indices = torch.topk(scores, k=config.num_experts_per_tok, dim=-1, sorted=False)
    return weights * config.routed_scaling_factor, indices


def hf_deepseek_v3(logits: torch.Tensor, bias: torch.Tensor, config: transformers.DeepseekV3Config):
    num_experts = config.n_routed_experts
    scores = logits.sigmoid()
    choice = scores + bias
    group_scores = choice.view(-1, config.n_group, num_experts // config.n_group).topk(2, dim=-1)[0].sum(dim=-1)
    choice = choice.masked_fill(~_group_mask(group_scores, config.topk_group, num_experts), float("-inf"))
    indices = torch.topk(choice, k=config.num_experts_per_tok, dim=-1, sorted=False)[1]
    weights = scores.gather(1, indices)
    if config.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * config.routed_scaling_factor, indices


def hf_deepseek_v4(logits: torch.Tensor, bias: torch.Tensor, config: transformers.DeepseekV4Config):
    """DeepseekV4TopKRouter after its gate matmul."""
    scores = ACT2FN[config.scoring_func](logits)
    indices = torch.topk(scores + bias, config.num_experts_per_tok, dim=-1, sorted=False).indices
    weights = scores.gather(1, indices)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * config.routed_scaling_factor, indices


def hf_deepseek_v4_hash(logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor,
                        config: transformers.DeepseekV4Config):
    """DeepseekV4HashRouter after its gate matmul."""
    scores = ACT2FN[config.scoring_func](logits)
    indices = tid2eid[token_ids.reshape(-1)].long()
    weights = scores.gather(1, indices)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * config.routed_scaling_factor, indices


def _logits(num_experts: int, tied: bool, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if tied:  # eight values: most tokens have experts (and groups) of equal score
        return (torch.randint(-4, 4, (TOKENS, num_experts), generator=generator) / 2).to(dtype)
    return torch.randn(TOKENS, num_experts, generator=generator).to(dtype)


def _check(ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor], exact: bool) -> None:
    """Same experts per token; their weights equal (or, where transformers' unsorted top-k sums the
    renormalisation in another order, within fp32 rounding)."""
    (weights, ids), (hf_weights, hf_ids) = ours, theirs
    assert weights.dtype == hf_weights.dtype and ids.dtype == hf_ids.dtype == torch.int64
    ids, order = ids.sort(dim=-1)
    hf_ids, hf_order = hf_ids.sort(dim=-1)
    assert torch.equal(ids, hf_ids)
    tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-6, "atol": 1e-30}
    torch.testing.assert_close(weights.gather(1, order), hf_weights.gather(1, hf_order), **tolerance)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixtral_router(tied: bool, top_k: int, dtype: torch.dtype) -> None:
    config = transformers.MixtralConfig(num_local_experts=8, num_experts_per_tok=top_k)
    logits = _logits(8, tied, top_k, dtype)
    _check(select_experts(logits, RouterConfig.mixtral(config)), hf_softmax_topk(logits, top_k, True, False), True)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("norm_topk_prob", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config_class", [transformers.Qwen2MoeConfig, transformers.Qwen3MoeConfig])
def test_qwen_moe_router(tied: bool, norm_topk_prob: bool, dtype: torch.dtype, config_class) -> None:
    config = config_class(num_experts=12, num_experts_per_tok=4, norm_topk_prob=norm_topk_prob)
    logits = _logits(12, tied, int(norm_topk_prob), dtype)
    _check(select_experts(logits, RouterConfig.qwen_moe(config)), hf_softmax_topk(logits, 4, norm_topk_prob, True),
           True)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(("topk_method", "n_group", "topk_group", "top_k"),
                         [("greedy", None, None, 3), ("group_limited_greedy", 4, 2, 3),
                          ("group_limited_greedy", 8, 3, 6), ("group_limited_greedy", 4, 1, 4)])
def test_deepseek_v2_router(tied: bool, topk_method: str, n_group: int | None, topk_group: int | None,
                            top_k: int) -> None:
    config = transformers.DeepseekV2Config(n_routed_experts=16, num_experts_per_tok=top_k, topk_method=topk_method,
                                           n_group=n_group, topk_group=topk_group, routed_scaling_factor=16.0)
    logits = _logits(16, tied, top_k)
    _check(select_experts(logits, RouterConfig.deepseek_v2(config)), hf_deepseek_v2(logits, config), True)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("norm_topk_prob", [False, True])
@pytest.mark.parametrize(("n_group", "topk_group", "top_k"), [(4, 2, 4), (8, 4, 8), (1, 1, 2), (4, 1, 3)])
def test_deepseek_v3_router(tied: bool, norm_topk_prob: bool, n_group: int, topk_group: int, top_k: int) -> None:
    config = transformers.DeepseekV3Config(n_routed_experts=32, num_experts_per_tok=top_k, n_group=n_group,
                                           topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                                           routed_scaling_factor=2.5)
    logits = _logits(32, tied, top_k)
    generator = torch.Generator().manual_seed(1)
    # A grid of biases too, so biased scores still tie; the bias reorders experts, never weights them.
    bias = torch.randint(-2, 3, (32,), generator=generator) / 8 if tied else torch.randn(32, generator=generator) / 4
    _check(select_experts(logits, RouterConfig.deepseek_v3(config), bias), hf_deepseek_v3(logits, bias, config),
           exact=not norm_topk_prob or top_k <= 2)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("scoring_func", ["sqrtsoftplus", "sigmoid"])
@pytest.mark.parametrize("top_k", [1, 2, 6])
def test_deepseek_v4_router(tied: bool, scoring_func: str, top_k: int) -> None:
    """V4 renormalises whatever norm_topk_prob says, so it is False here."""
    config = transformers.DeepseekV4Config(n_routed_experts=16, num_experts_per_tok=top_k, scoring_func=scoring_func,
                                           norm_topk_prob=False, routed_scaling_factor=1.5)
    logits = _logits(16, tied, top_k)
    generator = torch.Generator().manual_seed(2)
    bias = torch.randint(-2, 3, (16,), generator=generator) / 8 if tied else torch.randn(16, generator=generator) / 4
    _check(select_experts(logits, RouterConfig.deepseek_v4(config), bias), hf_deepseek_v4(logits, bias, config),
           exact=top_k <= 2)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("top_k", [1, 2, 6])
def test_deepseek_v4_hash_router(tied: bool, top_k: int) -> None:
    """The table picks the experts (whatever their scores); the scores weight them."""
    config = transformers.DeepseekV4Config(n_routed_experts=16, num_experts_per_tok=top_k, routed_scaling_factor=2.0)
    logits = _logits(16, tied, top_k)
    generator = torch.Generator().manual_seed(3)
    tid2eid = torch.rand(100, 16, generator=generator).argsort(dim=-1)[:, :top_k]
    token_ids = torch.randint(0, 100, (TOKENS,), generator=generator)
    router = dataclasses.replace(RouterConfig.deepseek_v4(config), correction_bias=False)  # as HashRouter keeps it
    _check(hashed_experts(logits, token_ids, tid2eid, router), hf_deepseek_v4_hash(logits, token_ids, tid2eid, config),
           exact=top_k <= 2)


def test_deepseek_v4_softmax_scoring_is_refused() -> None:
    with pytest.raises(ValueError, match="scoring_func"):
        RouterConfig.deepseek_v4(transformers.DeepseekV4Config(scoring_func="softmax"))


def test_hash_routing_refuses_a_correction_bias() -> None:
    config = RouterConfig(4, 1, scoring="sqrtsoftplus", correction_bias=True)
    with pytest.raises(ValueError, match="tid2eid"):
        hashed_experts(torch.randn(2, 4), torch.zeros(2, dtype=torch.int64), torch.zeros(8, 1, dtype=torch.int64),
                       config)


def test_bias_only_chooses() -> None:
    """A large bias on expert 0 makes every token pick it, with its unbiased sigmoid score as weight."""
    config = RouterConfig(4, 1, scoring="sigmoid", correction_bias=True)
    logits = torch.randn(5, 4)
    weights, ids = select_experts(logits, config, torch.tensor([100.0, 0.0, 0.0, 0.0]))
    assert ids.flatten().tolist() == [0] * 5
    torch.testing.assert_close(weights[:, 0], logits[:, 0].sigmoid(), rtol=0, atol=0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_experts": 4, "top_k": 5}, "num_experts_per_tok must be in"),
    ({"num_experts": 6, "top_k": 2, "num_groups": 4}, "must divide"),
    ({"num_experts": 8, "top_k": 2, "num_groups": 4, "topk_groups": 5}, "topk_group must be in"),
    ({"num_experts": 8, "top_k": 3, "num_groups": 4, "topk_groups": 1}, "exceeds the 2 experts"),
    ({"num_experts": 4, "top_k": 1, "num_groups": 4, "group_scoring": "top2_sum"}, "too small"),
])
def test_invalid_router_configs_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterConfig(**kwargs)


def test_correction_bias_must_match_the_config() -> None:
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        select_experts(torch.randn(2, 4), RouterConfig(4, 1), torch.zeros(4))


def test_unknown_deepseek_v2_topk_method_is_refused() -> None:
    config = transformers.DeepseekV2Config(n_routed_experts=8, num_experts_per_tok=2, topk_method="noaux_tc")
    with pytest.raises(ValueError, match="topk_method"):
        RouterConfig.deepseek_v2(config)
