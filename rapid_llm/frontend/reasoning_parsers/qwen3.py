"""qwen3: `<think>...</think>` opens the reply when the model thinks (Qwen3, QwQ).

With `chat_template_kwargs: {"enable_thinking": false}` Qwen3's template writes an empty think block into
the prompt and the reply has none: it is all content. Checkpoints whose template opens `<think>` in the
prompt (Qwen3-*-Thinking-2507) reply without the start tag: serve those with deepseek_r1.
"""

from __future__ import annotations

from rapid_llm.frontend.reasoning_parsers.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
