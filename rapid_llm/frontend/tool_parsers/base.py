"""What every tool-call parser returns, and the helpers the families share.

Key design choice: a parser is one pure function of the text so far, `parse(text, final)`, whose
partial results only ever grow: the content is a prefix of the final content, each call's name is
final once set and its arguments are a prefix of the final arguments. Streaming then needs no
per-family state machine -- `ToolCallStreamer` re-parses the accumulated text and sends what grew --
and the streamed deltas concatenate to exactly the non-streamed result, however the text was split.
A text that turns out not to be a well-formed call is plain content (as in vLLM).
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

ALPHANUMERIC = string.ascii_letters + string.digits
# What the marker-delimited families accept as a function name.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


class Malformed(Exception):
    """The text cannot be the call syntax it started as: it is content."""


class Incomplete(Exception):
    """The text ends inside a call: wait for more (a final text that does is content)."""


@dataclass
class ParsedCall:
    """One call; `name` None while it is not complete yet, `arguments` the JSON object text so far."""

    name: str | None = None
    arguments: str = ""


@dataclass
class ParseResult:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


def plain(text: str) -> ParseResult:
    """The result for text that holds no tool call."""
    return ParseResult(text)


class ToolParser:
    """Turns one family's model text into content and tool calls; one instance per choice."""

    name: ClassVar[str]
    # Families whose markers are special tokens need them kept in the text (as vLLM's mistral parser).
    keeps_special_tokens: ClassVar[bool] = False

    def __init__(self, tools: list[dict[str, Any]]) -> None:
        """`tools`: the request's tools as OpenAI dicts ({"type": "function", "function": {...}})."""
        self.tools = tools

    def parse(self, text: str, final: bool) -> ParseResult:
        """Content and calls of `text`; `final`: the text is complete (incomplete calls are then content)."""
        raise NotImplementedError

    def make_call_id(self) -> str:
        return "call_" + "".join(secrets.choice(ALPHANUMERIC) for _ in range(24))


def held_back(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker` (held back from content)."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def content_before(text: str, marker: str, final: bool) -> tuple[str, int]:
    """(content, index of the first `marker` or -1); without a marker the content of a partial text
    leaves out a trailing piece that may grow into it."""
    start = text.find(marker)
    if start >= 0:
        return text[:start], start
    if final:
        return text, -1
    return text[: len(text) - held_back(text, marker)], -1


def skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def is_prefix_at(text: str, pos: int, marker: str) -> bool:
    """True when `text` ends (after `pos`) inside a possible `marker`: wait for more text."""
    rest = text[pos:]
    return len(rest) < len(marker) and marker.startswith(rest)


def next_call_start(text: str, index: int, start: str, end: str, final: bool) -> int | None:
    """After a call that ended at `index`: its `end` marker must follow (space aside). Where the next `start`
    marker begins (-1: none), or None when a final text stops right after the call (the call still counts)."""
    index = skip_space(text, index)
    if index >= len(text) and final:
        return None
    if is_prefix_at(text, index, end):
        raise Incomplete
    if not text.startswith(end, index):
        raise Malformed(f"expected {end}")
    return text.find(start, index + len(end))


def object_arguments(pairs: list[str], closed: bool) -> str:
    """Arguments built from `"key": value` pairs: "{" + pairs joined by ", " (+ "}" once closed)."""
    return "{" + ", ".join(pairs) + ("}" if closed else "")


def tool_parameter_schemas(tools: list[dict[str, Any]], function_name: str) -> dict[str, Any]:
    """The `properties` of a tool's parameter schema ({} when the tool or its schema is unknown)."""
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == function_name:
            return (function.get("parameters") or {}).get("properties") or {}
    return {}
