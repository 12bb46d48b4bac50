"""llama3_json: Llama 3.1-3.3's JSON calls, `{"name": ..., "parameters": {...}}`, several joined by `;`.

The output is a tool call only when it starts with one (after an optional `<|python_tag|>`), as in
vLLM's parser of the same name; text after the last call is dropped.
"""

from __future__ import annotations

from rapid_llm.frontend.tool_parsers.base import Malformed, ParseResult, ToolParser, plain, skip_space
from rapid_llm.frontend.tool_parsers.json_calls import read_call_sequence

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def parse(self, text: str, final: bool) -> ParseResult:
        index = skip_space(text, 0)
        rest = text[index:]
        if not final and (not rest or PYTHON_TAG.startswith(rest)):
            return ParseResult("")  # could still become a call
        if rest.startswith(PYTHON_TAG):
            index = skip_space(text, index + len(PYTHON_TAG))
            if index >= len(text):
                return plain(text) if final else ParseResult("")
        if index >= len(text) or text[index] != "{":
            return plain(text)
        try:
            calls, end = read_call_sequence(text, index, ("parameters", "arguments"), ";", None, final)
        except Malformed:
            return plain(text)
        if end is None and final:
            return plain(text)
        return ParseResult("", calls)
