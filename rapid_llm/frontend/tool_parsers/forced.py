"""`tool_choice="required"` and a named function: the JSON schema the output is constrained to, and
the parsers that read that output as JSON directly (no family syntax), as vLLM does.

required: an array of one or more `{"name": ..., "parameters": {...}}` objects, each matching one of
the tools (at most one item when `parallel_tool_calls` is false); named: the function's parameters
object itself. `$defs` of the tools' schemas are lifted to the root, where their `$ref`s point.
"""

from __future__ import annotations

import json
from typing import Any

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.tool_parsers.base import Malformed, ParsedCall, ParseResult, ToolParser, plain, skip_space
from rapid_llm.frontend.tool_parsers.json_calls import read_call_sequence

_SPACE = " \t\r\n"
_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or _EMPTY_OBJECT


def _lift_defs(schemas: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The schemas without their `$defs`, and those definitions merged (a name defined twice
    differently is a 400: the refs could not tell them apart)."""
    merged: dict[str, Any] = {}
    stripped = []
    for schema in schemas:
        for name, definition in (schema.get("$defs") or {}).items():
            if merged.setdefault(name, definition) != definition:
                raise bad_request(f"tools define $defs {name!r} differently; give the definitions distinct "
                                  "names", param="tools")
        stripped.append({k: v for k, v in schema.items() if k != "$defs"})
    return stripped, merged


def required_schema(tools: list[dict[str, Any]], parallel_tool_calls: bool) -> dict[str, Any]:
    """The schema of `tool_choice="required"` output: a non-empty array of calls of the given tools."""
    parameters, defs = _lift_defs([_parameters(tool) for tool in tools])
    items = [
        {"type": "object",
         "properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]}, "parameters": schema},
         "required": ["name", "parameters"]}
        for tool, schema in zip(tools, parameters)
    ]
    array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if not parallel_tool_calls:
        array["maxItems"] = 1
    if defs:
        array["$defs"] = defs
    return array


def named_schema(tools: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The schema of a named tool choice: that function's parameters."""
    for tool in tools:
        if tool["function"]["name"] == name:
            return _parameters(tool)
    raise bad_request(f"tool_choice names the function {name!r}, which is not among the tools", param="tool_choice")


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False)


class RequiredToolParser(ToolParser):
    """Reads the JSON array `required_schema` describes; anything else is content."""

    name = "required"

    def parse(self, text: str, final: bool) -> ParseResult:
        index = skip_space(text, 0)
        if index >= len(text):
            return plain(text) if final else ParseResult("")
        if text[index] != "[":
            return plain(text)
        try:
            calls, end = read_call_sequence(text, index + 1, ("parameters",), ",", "]", final)
        except Malformed:
            return plain(text)
        if end is None and final:
            return plain(text)
        return ParseResult("", calls)


class NamedToolParser(ToolParser):
    """The whole output is the named function's arguments (surrounding whitespace aside)."""

    name = "named"

    def __init__(self, tools: list[dict[str, Any]], function_name: str) -> None:
        super().__init__(tools)
        self.function_name = function_name

    def parse(self, text: str, final: bool) -> ParseResult:
        # A partial text's trailing whitespace may lie inside the arguments: it waits for what follows.
        arguments = text.strip(_SPACE) if final else text.lstrip(_SPACE).rstrip(_SPACE)
        return ParseResult("", [ParsedCall(self.function_name, arguments)])
