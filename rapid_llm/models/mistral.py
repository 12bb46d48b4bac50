"""Mistral: Llama's architecture plus a model-wide sliding window, which the shared block reads from config."""

from rapid_llm.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    pass
