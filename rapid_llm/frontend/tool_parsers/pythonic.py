"""pythonic: a Python list of calls, `[get_weather(city="Paris", days=3), other()]` (Llama 3.2/4,
ToolACE), keyword arguments holding Python literals, turned into JSON objects.

The output is a tool call only when it starts with `[name(`; text after the closing `]` is dropped.
The arguments grow one complete keyword argument at a time; a value that is not a literal (a
variable name, an expression) makes the whole text content, as in vLLM's parser of the same name.
"""

from __future__ import annotations

import ast
import json
import re

from rapid_llm.frontend.tool_parsers.base import (
    Incomplete, Malformed, ParsedCall, ParseResult, ToolParser, object_arguments, plain, skip_space)

_CALL_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_MAYBE_CALL_START = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?")
_NAME = re.compile(r"[A-Za-z_][\w.]*")
_KEYWORD = re.compile(r"([A-Za-z_]\w*)\s*=\s*")
_CLOSERS = {")": "(", "]": "[", "}": "{"}




def _value_end(text: str, pos: int) -> int:
    """The end of the Python expression at `pos`: the first `,` or `)` outside brackets and strings."""
    stack: list[str] = []
    index = pos
    while index < len(text):
        char = text[index]
        if char in "'\"":
            quote = text[index:index + 3] if text.startswith(char * 3, index) else char
            index += len(quote)
            while not text.startswith(quote, index):
                if index >= len(text):
                    raise Incomplete
                index += 2 if text[index] == "\\" else 1
            index += len(quote)
            continue
        if char in "([{":
            stack.append(char)
        elif char in ")]}":
            if not stack:
                if char == ")":
                    return index
                raise Malformed
            if stack.pop() != _CLOSERS[char]:
                raise Malformed
        elif char == "," and not stack:
            return index
        index += 1
    raise Incomplete


def _json_literal(source: str) -> str:
    try:
        value = ast.literal_eval(source.strip())
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise Malformed from None


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def parse(self, text: str, final: bool) -> ParseResult:
        index = skip_space(text, 0)
        if not _CALL_START.match(text, index):
            if not final and _MAYBE_CALL_START.fullmatch(text, index):
                return ParseResult("")  # `[` or `[name` may still become a call
            return plain(text)
        result = ParseResult("")
        try:
            index += 1
            while True:
                index = self._call(text, skip_space(text, index), result)
                index = skip_space(text, index)
                if index >= len(text):
                    raise Incomplete
                if text[index] == "]":
                    return result
                if text[index] != ",":
                    raise Malformed
                index += 1
        except Malformed:
            return plain(text)
        except Incomplete:
            return plain(text) if final else result

    def _call(self, text: str, index: int, result: ParseResult) -> int:
        """Read one `name(key=value, ...)` into `result`; return the index after its `)`."""
        name = _NAME.match(text, index)
        if name is None:
            raise Incomplete if index >= len(text) else Malformed
        paren = skip_space(text, name.end())
        if paren >= len(text):
            raise Incomplete
        if text[paren] != "(":
            raise Malformed
        call = ParsedCall(name.group())
        result.calls.append(call)
        pairs: list[str] = []
        call.arguments = object_arguments(pairs, closed=False)
        index = paren + 1
        while True:
            index = skip_space(text, index)
            if index >= len(text):
                raise Incomplete
            if text[index] == ")":
                call.arguments = object_arguments(pairs, closed=True)
                return index + 1
            keyword = _KEYWORD.match(text, index)
            if keyword is None:
                if re.fullmatch(r"[A-Za-z_]\w*\s*", text[index:]):
                    raise Incomplete
                raise Malformed
            end = _value_end(text, keyword.end())
            pairs.append(f"{json.dumps(keyword.group(1))}: {_json_literal(text[keyword.end():end])}")
            call.arguments = object_arguments(pairs, closed=False)
            index = end + 1 if text[end] == "," else end
