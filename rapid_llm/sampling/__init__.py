"""Sampling parameters: plain data shared by the frontend, scheduler and worker (no torch)."""

from rapid_llm.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
