"""deepseek_r1: the chat template ends the prompt with `<think>\\n`, so the reply starts as reasoning.

Reasoning runs until `</think>`; a reply that never closes the block (cut by max_tokens) is all reasoning.
A `<think>` the model repeats at the start (older templates did not write it) is dropped.
"""

from __future__ import annotations

from rapid_llm.frontend.reasoning_parsers.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    opens_in_reasoning = True
