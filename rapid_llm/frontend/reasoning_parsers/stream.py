"""ReasoningStream: one choice's text, piece by piece, split into reasoning and content at the think tags.

Key design choice: a small state machine over the new text only (no re-scan of what was sent), that holds
back just the trailing characters which could still become a tag, so a tag split across deltas is never
sent as text. A whole response is one `feed(text, final=True)`, so streamed pieces always concatenate to
the whole response's split, however the text was cut.
Usage: `stream = ReasoningStream("<think>", "</think>", opens_in_reasoning=False)`;
`reasoning, content = stream.feed(delta_text, final=finished)`.
"""

from __future__ import annotations

import enum

from rapid_llm.frontend.tool_parsers.base import held_back


class Phase(enum.Enum):
    OPENING = "opening"  # nothing but whitespace yet: the start tag may still come
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningStream:
    def __init__(self, start_tag: str, end_tag: str, opens_in_reasoning: bool) -> None:
        """`opens_in_reasoning`: the prompt opened the think block, so text without a start tag is reasoning."""
        self.start_tag = start_tag
        self.end_tag = end_tag
        self.opens_in_reasoning = opens_in_reasoning
        self.phase = Phase.OPENING
        self.saw_reasoning = False  # a think block opened (by the start tag or by the prompt)
        self._pending = ""  # text not classified yet: a possible partial tag (or the whitespace before one)

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """(new reasoning, new content) once `text` is added; `final`: the text is complete, flush what is held."""
        pending = self._pending + text
        reasoning = ""
        if self.phase is Phase.OPENING:
            stripped = pending.lstrip()
            if stripped.startswith(self.start_tag):
                pending = stripped[len(self.start_tag):]
                self.phase = Phase.REASONING
            elif not final and self.start_tag.startswith(stripped):
                self._pending = pending
                return "", ""
            else:
                self.phase = Phase.REASONING if self.opens_in_reasoning else Phase.CONTENT
            self.saw_reasoning = self.phase is Phase.REASONING
        if self.phase is Phase.REASONING:
            end = pending.find(self.end_tag)
            if end < 0:
                keep = 0 if final else held_back(pending, self.end_tag)
                self._pending = pending[len(pending) - keep:]
                return pending[:len(pending) - keep], ""
            reasoning, pending = pending[:end], pending[end + len(self.end_tag):]
            self.phase = Phase.CONTENT
        self._pending = ""
        return reasoning, pending
