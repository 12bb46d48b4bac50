"""rapid_llm: an OpenAI-compatible LLM inference server that runs on CPU and GPU.

`LLM` and `SamplingParams` are exported lazily so `import rapid_llm` stays cheap for processes
that need neither.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from rapid_llm.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from rapid_llm.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'rapid_llm' has no attribute {name!r}")
