"""Reasoning parsers, one module per model family, chosen by `--reasoning-parser NAME` (vLLM's names).

Usage: `REASONING_PARSERS.get(name)(constrained)`; an unknown name raises a ValueError naming the flag and
the choices (`REASONING_PARSERS.check(name)` at start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rapid_llm.utils.registry import Registry

if TYPE_CHECKING:
    from rapid_llm.frontend.reasoning_parsers.base import ReasoningParser

REASONING_PARSERS: Registry[type["ReasoningParser"]] = Registry("--reasoning-parser", {
    "deepseek_r1": "rapid_llm.frontend.reasoning_parsers.deepseek_r1:DeepSeekR1ReasoningParser",
    "qwen3": "rapid_llm.frontend.reasoning_parsers.qwen3:Qwen3ReasoningParser",
})
