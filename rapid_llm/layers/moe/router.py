"""MoE routers: from router logits to each token's top-k expert ids and routing weights, batched over tokens.

One `RouterConfig` describes every router transformers implements for the models served here: softmax
top-k with optional renormalisation (Mixtral, Qwen2/3-MoE), DeepSeek-V2's optionally group-limited
softmax ("group_limited_greedy") and DeepSeek-V3's sigmoid scores with `e_score_correction_bias` (used to
choose experts, never to weight them) inside the best groups ("noaux_tc"), DeepSeek-V4's sqrt(softplus)
scores (biased the same way) and its hash routing (`HashRouter`: a fixed token -> experts table `tid2eid`
picks the experts, the gate's scores still weight them), then `routed_scaling_factor`.
The presets (`RouterConfig.mixtral(config)`, ...) state each model's rules as transformers applies them,
including the weights' dtype: Qwen rounds them to the logits' dtype, Mixtral and DeepSeek keep fp32.
Usage: `weights, ids = select_experts(logits [T, E], RouterConfig.qwen_moe(config))`, or the `Router`
module (the checkpoint's `gate`), which computes the logits too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import nn
from transformers import PretrainedConfig

from rapid_llm import ops

Scoring = Literal["softmax", "sigmoid", "sqrtsoftplus"]
# How a group of experts is ranked: its best score (DeepSeek-V2) or the sum of its best two (DeepSeek-V3).
GroupScoring = Literal["max", "top2_sum"]


@dataclass(frozen=True)
class RouterConfig:
    num_experts: int
    top_k: int
    scoring: Scoring = "softmax"
    renormalize: bool = False
    num_groups: int = 1  # > 1: experts come only from the `topk_groups` best of `num_groups` equal groups
    topk_groups: int = 1
    group_scoring: GroupScoring = "max"
    correction_bias: bool = False  # a learned per-expert bias added to the scores for selection only
    routed_scaling_factor: float = 1.0
    fp32_logits: bool = False  # the gate weight is kept in fp32 and the logits computed in fp32 (DeepSeek)
    weights_in_logits_dtype: bool = False  # round the weights to the logits' dtype (Qwen), else keep fp32

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {self.num_experts}], got {self.top_k}")
        if self.num_groups < 1 or self.num_experts % self.num_groups:
            raise ValueError(f"n_group ({self.num_groups}) must divide the {self.num_experts} experts")
        if self.num_groups > 1:
            group_size = self.num_experts // self.num_groups
            if not 0 < self.topk_groups <= self.num_groups:
                raise ValueError(f"topk_group must be in [1, n_group={self.num_groups}], got {self.topk_groups}")
            if self.top_k > self.topk_groups * group_size:
                raise ValueError(f"num_experts_per_tok ({self.top_k}) exceeds the {self.topk_groups * group_size} "
                                 f"experts of the topk_group={self.topk_groups} groups it may choose from")
            if self.group_scoring == "top2_sum" and group_size < 2:
                raise ValueError(f"DeepSeek-V3 routing ranks groups by their best two experts; groups of "
                                 f"{group_size} (n_group={self.num_groups}) are too small")

    @classmethod
    def mixtral(cls, config: PretrainedConfig) -> RouterConfig:
        return cls(config.num_local_experts, config.num_experts_per_tok, renormalize=True)

    @classmethod
    def qwen_moe(cls, config: PretrainedConfig) -> RouterConfig:
        """Qwen2-MoE and Qwen3-MoE."""
        return cls(config.num_experts, config.num_experts_per_tok, renormalize=config.norm_topk_prob,
                   weights_in_logits_dtype=True)

    @classmethod
    def deepseek_v2(cls, config: PretrainedConfig) -> RouterConfig:
        """topk_method "greedy" or "group_limited_greedy"; transformers never renormalises here, whatever
        `norm_topk_prob` says."""
        if config.topk_method not in ("greedy", "group_limited_greedy"):
            raise ValueError(f"DeepSeek-V2 topk_method must be 'greedy' or 'group_limited_greedy', "
                             f"got {config.topk_method!r}")
        grouped = config.topk_method == "group_limited_greedy"
        return cls(config.n_routed_experts, config.num_experts_per_tok,
                   num_groups=config.n_group if grouped else 1, topk_groups=config.topk_group if grouped else 1,
                   routed_scaling_factor=config.routed_scaling_factor, fp32_logits=True)

    @classmethod
    def deepseek_v3(cls, config: PretrainedConfig) -> RouterConfig:
        """noaux_tc, the only routing transformers implements for DeepSeek-V3."""
        return cls(config.n_routed_experts, config.num_experts_per_tok, scoring="sigmoid",
                   renormalize=config.norm_topk_prob, num_groups=config.n_group, topk_groups=config.topk_group,
                   group_scoring="top2_sum", correction_bias=True,
                   routed_scaling_factor=config.routed_scaling_factor, fp32_logits=True)


    @classmethod
    def deepseek_v4(cls, config: PretrainedConfig) -> RouterConfig:
        """transformers' V4 routers always renormalise (whatever `norm_topk_prob` says); the top-k router's scores
        are biased by e_score_correction_bias for selection. transformers computes the gate in the model dtype;
        here it is fp32 as for V2/V3, so a bf16 model's choices follow the fp32 ones (rounded bf16 logits tie
        and flip experts)."""
        # transformers applies scoring_func elementwise (ACT2FN): softmax, which its docs name, fails there.
        if config.scoring_func not in ("sigmoid", "sqrtsoftplus"):
            raise ValueError(f"DeepSeek-V4 scoring_func must be sigmoid or sqrtsoftplus, got {config.scoring_func!r}")
        return cls(config.n_routed_experts, config.num_experts_per_tok, scoring=config.scoring_func,
                   renormalize=True, correction_bias=True, routed_scaling_factor=config.routed_scaling_factor,
                   fp32_logits=True)


def _scores(logits: torch.Tensor, scoring: Scoring) -> torch.Tensor:
    if scoring == "softmax":
        return logits.softmax(dim=-1)
    if scoring == "sigmoid":
        return logits.sigmoid()
    return torch.sqrt(torch.nn.functional.softplus(logits))


def _routing_weights(scores: torch.Tensor, expert_ids: torch.Tensor, config: RouterConfig,
                     logits_dtype: torch.dtype) -> torch.Tensor:
    weights = scores.gather(1, expert_ids)
    if config.renormalize:
        # The epsilon is DeepSeek-V3's guard against all-zero sigmoid scores; added to a softmax top-k sum
        # (at least top_k / E) it vanishes in fp32 rounding, so one rule serves every router.
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if config.routed_scaling_factor != 1.0:
        weights = weights * config.routed_scaling_factor
    if config.weights_in_logits_dtype:
        weights = weights.to(logits_dtype)
    return weights


def _limit_to_best_groups(choice: torch.Tensor, config: RouterConfig, masked_value: float) -> torch.Tensor:
    """`choice` with every expert outside each token's `topk_groups` best groups set to `masked_value`."""
    grouped = choice.view(choice.shape[0], config.num_groups, -1)
    if config.group_scoring == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    best_groups = group_scores.topk(config.topk_groups, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), masked_value).view_as(choice)


def select_experts(router_logits: torch.Tensor, config: RouterConfig,
                   correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, top_k], expert ids [T, top_k]) for router logits [T, E]."""
    if (correction_bias is not None) != config.correction_bias:
        raise ValueError("e_score_correction_bias must be given exactly when the router config has one")
    scores = _scores(router_logits.float(), config.scoring)
    choice = scores if correction_bias is None else scores + correction_bias
    if config.num_groups > 1:
        # transformers fills 0 for softmax scores (all positive) and -inf for biased sigmoid scores (which
        # may be negative); either way no expert of a dropped group outranks a kept one.
        choice = _limit_to_best_groups(choice, config, 0.0 if config.scoring == "softmax" else float("-inf"))
    expert_ids = choice.topk(config.top_k, dim=-1).indices
    return _routing_weights(scores, expert_ids, config, router_logits.dtype), expert_ids


def hashed_experts(router_logits: torch.Tensor, token_ids: torch.Tensor, tid2eid: torch.Tensor,
                   config: RouterConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids) of hash routing: the experts are `tid2eid[token]` ([vocab, top_k] table), weighted
    by their scores as `select_experts` weights its choices (no bias, no groups)."""
    if config.correction_bias or config.num_groups > 1:
        raise ValueError("hash routing takes its experts from tid2eid: no correction bias or groups")
    expert_ids = tid2eid[token_ids].long()
    scores = _scores(router_logits.float(), config.scoring)
    return _routing_weights(scores, expert_ids, config, router_logits.dtype), expert_ids


class Router(nn.Module):
    """The checkpoint's `gate`: weight [E, H] (and DeepSeek-V3's `e_score_correction_bias` [E], fp32), routing
    each token with `select_experts`. A replicated weight: every rank routes all tokens."""

    def __init__(self, hidden_size: int, config: RouterConfig) -> None:
        super().__init__()
        self.config = config
        weight_dtype = torch.float32 if config.fp32_logits else None  # None: the model dtype
        self.weight = nn.Parameter(torch.empty(config.num_experts, hidden_size, dtype=weight_dtype),
                                   requires_grad=False)
        bias = torch.empty(config.num_experts, dtype=torch.float32) if config.correction_bias else None
        self.register_parameter("e_score_correction_bias",
                                None if bias is None else nn.Parameter(bias, requires_grad=False))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = hidden_states.float() if self.config.fp32_logits else hidden_states
        return select_experts(ops.linear(x, self.weight), self.config, self.e_score_correction_bias)


class HashRouter(nn.Module):
    """DeepSeek-V4's `hash_moe` gate: weight [E, H] scores the experts the checkpoint's `tid2eid` [vocab, top_k]
    table assigns to each token id; called with the hidden states and the token ids."""

    def __init__(self, hidden_size: int, vocab_size: int, config: RouterConfig) -> None:
        super().__init__()
        self.config = replace(config, correction_bias=False)
        weight_dtype = torch.float32 if config.fp32_logits else None  # None: the model dtype
        self.weight = nn.Parameter(torch.empty(config.num_experts, hidden_size, dtype=weight_dtype),
                                   requires_grad=False)
        self.tid2eid = nn.Parameter(torch.zeros(vocab_size, config.top_k, dtype=torch.int64), requires_grad=False)

    def forward(self, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = hidden_states.float() if self.config.fp32_logits else hidden_states
        return hashed_experts(ops.linear(x, self.weight), token_ids, self.tid2eid, self.config)
