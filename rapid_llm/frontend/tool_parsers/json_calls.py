"""Reading `{"name": ..., "arguments": {...}}` call objects out of partial model text.

Key design choice: the arguments are the object's raw text as the model wrote it (a valid JSON
string, checked once the object closes), not a re-serialisation: while the object is still open
every character seen belongs to it, so the streamed arguments are exact prefixes of the final ones.
Used by the hermes, llama3_json and mistral families and by `tool_choice="required"`.
"""

from __future__ import annotations

import json

from rapid_llm.frontend.tool_parsers.base import Malformed, ParsedCall, skip_space

_SCALAR_END = ",}] \t\r\n"


def json_value_end(text: str, pos: int, final: bool) -> int | None:
    """The end (exclusive) of the JSON value starting at `text[pos]`, None if the text ends first.

    Only the extent is found (strings, nesting); whether the value is valid JSON is checked later.
    """
    first = text[pos]
    if first == '"':
        return _string_end(text, pos)
    if first in "{[":
        depth, index = 0, pos
        while index < len(text):
            char = text[index]
            if char == '"':
                end = _string_end(text, index)
                if end is None:
                    return None
                index = end
                continue
            if char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return index + 1
            index += 1
        return None
    index = pos
    while index < len(text) and text[index] not in _SCALAR_END:
        index += 1
    # A number at the very end of a partial text may still grow.
    return index if index < len(text) or final else None


def _string_end(text: str, pos: int) -> int | None:
    index = pos + 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == '"':
            return index + 1
        index += 1
    return None


def _loads(raw: str) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        raise Malformed(raw) from None


def read_call_object(text: str, pos: int, argument_keys: tuple[str, ...], final: bool) -> tuple[ParsedCall, int | None]:
    """The call object starting at `text[pos]` (a "{"): (the call so far, its end or None while open).

    Raises `Malformed` for anything that cannot become a call object: no name, a non-string name, a
    non-object argument value, invalid JSON.
    """
    call = ParsedCall()
    found_arguments = False
    index = pos + 1
    while True:
        index = skip_space(text, index)
        if index >= len(text):
            return call, None
        if text[index] == "}":
            if call.name is None:
                raise Malformed("a call object without a name")
            _loads(text[pos:index + 1])  # the values of other keys are valid JSON too
            if not found_arguments:
                call.arguments = "{}"
            return call, index + 1
        if text[index] == ",":
            index += 1
            continue
        if text[index] != '"':
            raise Malformed("expected a key")
        key_end = _string_end(text, index)
        if key_end is None:
            return call, None
        key = _loads(text[index:key_end])
        index = skip_space(text, key_end)
        if index >= len(text):
            return call, None
        if text[index] != ":":
            raise Malformed("expected ':'")
        index = skip_space(text, index + 1)
        if index >= len(text):
            return call, None
        value_end = json_value_end(text, index, final)
        if key in argument_keys:
            found_arguments = True
            call.arguments = arguments_text(text, index, value_end)
        if value_end is None:
            return call, None
        if key == "name":
            name = _loads(text[index:value_end])
            if not isinstance(name, str) or not name:
                raise Malformed("the name is not a string")
            call.name = name
        index = value_end


def arguments_text(text: str, start: int, end: int | None) -> str:
    """An object is taken as written (its prefix while open); a JSON string holding an object (some
    models encode the arguments) is decoded once complete."""
    if text[start] == "{":
        if end is not None and not isinstance(_loads(text[start:end]), dict):
            raise Malformed("the arguments are not an object")
        return text[start:] if end is None else text[start:end]
    if text[start] != '"':
        raise Malformed("the arguments are not an object")
    if end is None:
        return ""
    decoded = _loads(text[start:end])
    if not isinstance(decoded, str) or not isinstance(_loads(decoded), dict):
        raise Malformed("the arguments are not an object")
    return decoded


def read_call_sequence(text: str, pos: int, argument_keys: tuple[str, ...], separator: str,
                       close: str | None, final: bool) -> tuple[list[ParsedCall], int | None]:
    """Call objects from `text[pos]` on, separated by `separator`, until `close` (or, if None, the first
    text that is not a separator); returns the calls and the end after the sequence (None while open)."""
    calls: list[ParsedCall] = []
    index = pos
    while True:
        index = skip_space(text, index)
        if index >= len(text):
            # Between calls at the end of a final text: a sequence without a closing mark is complete.
            return calls, len(text) if final and close is None and calls else None
        if text[index] != "{":
            raise Malformed("expected a call object")
        call, end = read_call_object(text, index, argument_keys, final)
        calls.append(call)
        if end is None:
            return calls, None
        index = skip_space(text, end)
        if index >= len(text):
            return calls, len(text) if final and close is None else None
        if text[index] == separator:
            index += 1
            continue
        if close is None:
            return calls, index
        if text[index] != close:
            raise Malformed(f"expected {separator!r} or {close!r}")
        return calls, index + 1
