"""Qwen2: the Llama block with biases on q/k/v (not on o)."""

from __future__ import annotations

from transformers import PretrainedConfig

from rapid_llm.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_options(config: PretrainedConfig) -> dict[str, bool]:
        return {"qkv_bias": True, "o_bias": False, "qk_norm": False}
