"""Mixture-of-experts blocks: router.py (routing), experts.py (stacked experts, `ops.fused_moe`), ep_experts.py
(experts partitioned over expert-parallel ranks),
sparse_block.py (router + experts + optional shared experts, what a decoder layer holds)."""

from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.layers.moe.router import Router, RouterConfig, select_experts
from rapid_llm.layers.moe.sparse_block import SparseMoeBlock

__all__ = ["FusedExperts", "Router", "RouterConfig", "SparseMoeBlock", "select_experts"]
