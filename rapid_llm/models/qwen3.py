"""Qwen3: the Llama block with per-head RMSNorm on q and k, and an explicit head_dim."""

from __future__ import annotations

from transformers import PretrainedConfig

from rapid_llm.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_options(config: PretrainedConfig) -> dict[str, bool]:
        bias = getattr(config, "attention_bias", False)
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True}
