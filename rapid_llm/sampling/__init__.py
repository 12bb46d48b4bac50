"""Sampling parameters and the context-length check, shared by the frontend, scheduler and worker (no torch)."""

from rapid_llm.sampling.context_length import ContextLengthError, check_prompt_length, fit_max_tokens
from rapid_llm.sampling.params import SamplingParams, StructuredOutputsParams

__all__ = ["ContextLengthError", "SamplingParams", "StructuredOutputsParams", "check_prompt_length", "fit_max_tokens"]
