"""ToolCallStreamer: a parser's growing results turned into OpenAI `delta.content` / `delta.tool_calls`.

Each call opens with one entry holding its index, id, type and name (and the arguments known so
far), then only argument fragments follow, the shape the OpenAI SDK's stream accumulation expects.
What a partial parse promised is never taken back: should the final parse disagree (a call that
never closed, which a non-streamed response turns into content), what was sent stands.
"""

from __future__ import annotations

from typing import Any

from rapid_llm.frontend.tool_parsers.base import ParsedCall, ParseResult, ToolParser


def tool_call_dict(call_id: str, call: ParsedCall) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def limit_calls(result: ParseResult, parallel_tool_calls: bool) -> ParseResult:
    """Without parallel tool calls only the first call is kept."""
    if parallel_tool_calls or len(result.calls) <= 1:
        return result
    return ParseResult(result.content, result.calls[:1])


class ToolCallStreamer:
    """One choice's stream: feed each new piece of text, get the content and tool-call deltas it adds."""

    def __init__(self, parser: ToolParser, parallel_tool_calls: bool = True) -> None:
        self.parser = parser
        self.parallel_tool_calls = parallel_tool_calls
        self._text_parts: list[str] = []
        self._sent_content = ""
        self._ids: list[str] = []
        self._sent_arguments: list[str] = []

    @property
    def called_tools(self) -> bool:
        return bool(self._ids)

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(new content, new `tool_calls` entries) once `text` is added; `final`: the text is complete."""
        self._text_parts.append(text)
        whole = "".join(self._text_parts)
        self._text_parts = [whole]
        result = limit_calls(self.parser.parse(whole, final), self.parallel_tool_calls)
        content = ""
        if not self._ids and result.content.startswith(self._sent_content):
            content = result.content[len(self._sent_content):]
            self._sent_content = result.content
        entries: list[dict[str, Any]] = []
        for index, call in enumerate(result.calls):
            if call.name is None:
                break
            if index == len(self._ids):
                self._ids.append(self.parser.make_call_id())
                self._sent_arguments.append(call.arguments)
                entries.append({"index": index, **tool_call_dict(self._ids[index], call)})
                continue
            sent = self._sent_arguments[index]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                entries.append({"index": index, "function": {"arguments": call.arguments[len(sent):]}})
                self._sent_arguments[index] = call.arguments
        return content, entries
