"""qwen3_coder: Qwen3-Coder's XML calls, `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
</function></tool_call>`.

Values are written bare, so they are typed by the tool's parameter schema: strings stay as written,
numbers, booleans, objects and arrays are read as JSON (a value that does not read as its type stays a
string, as does a parameter the schema does not list). The arguments grow one complete parameter at
a time. One newline right after `<parameter=KEY>` and right before `</parameter>` is layout, not value.
"""

from __future__ import annotations

import json
from typing import Any

from rapid_llm.frontend.tool_parsers.base import (
    Incomplete, Malformed, ParsedCall, ParseResult, ToolParser, content_before, is_prefix_at, next_call_start,
    object_arguments, plain, skip_space, tool_parameter_schemas)

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"




def typed_value(raw: str, schema: dict[str, Any]) -> Any:
    """`raw` read as the JSON type `schema` names; as written when it is a string or does not read as one."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is None or "string" in kinds:
        return raw
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    matches = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
               "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "boolean": lambda v: isinstance(v, bool), "object": lambda v: isinstance(v, dict),
               "array": lambda v: isinstance(v, list), "null": lambda v: v is None}
    return value if any(matches.get(k, lambda v: False)(value) for k in kinds) else raw


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"

    def parse(self, text: str, final: bool) -> ParseResult:
        content, start = content_before(text, START, final)
        if start < 0:
            return ParseResult(content)
        result = ParseResult(content)
        try:
            while start >= 0:
                start = next_call_start(text, self._call(text, start + len(START), result), START, END, final)
                if start is None:
                    return result
            return result
        except Malformed:
            return plain(text)
        except Incomplete:
            return plain(text) if final else result

    def _call(self, text: str, index: int, result: ParseResult) -> int:
        """Read one `<function=...>...</function>` into `result`; return the index after it."""
        index = skip_space(text, index)
        if is_prefix_at(text, index, FUNCTION):
            raise Incomplete
        if not text.startswith(FUNCTION, index):
            raise Malformed
        name_end = text.find(">", index)
        if name_end < 0:
            raise Incomplete
        call = ParsedCall(text[index + len(FUNCTION):name_end].strip())
        if not call.name or "<" in call.name:
            raise Malformed
        result.calls.append(call)
        schemas = tool_parameter_schemas(self.tools, call.name)
        pairs: list[str] = []
        call.arguments = object_arguments(pairs, closed=False)
        index = name_end + 1
        while True:
            index = skip_space(text, index)
            if text.startswith(FUNCTION_END, index):
                call.arguments = object_arguments(pairs, closed=True)
                return index + len(FUNCTION_END)
            if is_prefix_at(text, index, FUNCTION_END) or is_prefix_at(text, index, PARAMETER):
                raise Incomplete
            if not text.startswith(PARAMETER, index):
                raise Malformed
            key_end = text.find(">", index)
            value_end = text.find(PARAMETER_END, key_end)
            if key_end < 0 or value_end < 0:
                raise Incomplete
            key = text[index + len(PARAMETER):key_end].strip()
            raw = text[key_end + 1:value_end]
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            value = typed_value(raw, schemas.get(key) or {})
            pairs.append(f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}")
            call.arguments = object_arguments(pairs, closed=False)
            index = value_end + len(PARAMETER_END)
