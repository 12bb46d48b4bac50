"""ReasoningParser: what a reasoning model's think block looks like, and the split of a whole response.

Key design choice: a family is data, not code: its tags and whether the chat template already opened the
think block in the prompt. All parsing is `ReasoningStream`'s, so whole and streamed responses split alike.
A request whose output a grammar constrains from its first token (structured output, a required or named
tool call) cannot think, so for it an unopened block is never implied.
Usage: `parser = REASONING_PARSERS.get("qwen3")(constrained=False)`; `parser.split(text)` for a whole
response, `parser.stream()` per streamed choice.
"""

from __future__ import annotations

from typing import ClassVar

from rapid_llm.frontend.reasoning_parsers.stream import ReasoningStream


class ReasoningParser:
    name: ClassVar[str]
    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    # The chat template ends the prompt inside an opened think block: output without a start tag is reasoning.
    opens_in_reasoning: ClassVar[bool] = False

    def __init__(self, constrained: bool = False) -> None:
        """`constrained`: a grammar shapes the output from its first token (no thinking is implied)."""
        self.implied_reasoning = self.opens_in_reasoning and not constrained

    def stream(self) -> ReasoningStream:
        """A fresh splitter for one streamed choice."""
        return ReasoningStream(self.start_tag, self.end_tag, self.implied_reasoning)

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, content) of a whole response; reasoning is None when no think block opened."""
        stream = self.stream()
        reasoning, content = stream.feed(text, final=True)
        return (reasoning if stream.saw_reasoning else None), content
