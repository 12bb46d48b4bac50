"""hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, once per call (Hermes, Qwen2.5/Qwen3).

Content is the text before the first `<tool_call>`; text between or after the calls is dropped,
as in vLLM's parser of the same name.
"""

from __future__ import annotations

from rapid_llm.frontend.tool_parsers.base import (
    Incomplete, Malformed, ParseResult, ToolParser, content_before, next_call_start, plain, skip_space)
from rapid_llm.frontend.tool_parsers.json_calls import read_call_object

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def parse(self, text: str, final: bool) -> ParseResult:
        content, start = content_before(text, START, final)
        result = ParseResult(content)
        try:
            while start >= 0:
                index = skip_space(text, start + len(START))
                if index >= len(text):
                    raise Incomplete
                if text[index] != "{":
                    raise Malformed("expected a call object")
                call, end = read_call_object(text, index, ("arguments", "parameters"), final)
                result.calls.append(call)
                if end is None:
                    raise Incomplete
                start = next_call_start(text, end, START, END, final)
                if start is None:
                    return result
            return result
        except Malformed:
            return plain(text)
        except Incomplete:
            return plain(text) if final else result
