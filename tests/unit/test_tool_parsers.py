"""Tool-call parsers on model-text fixtures in each family's own format: the non-streamed result, and
streams split at every character position (and one character at a time) that must add up to it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.tool_parsers import TOOL_PARSERS, ToolParser, parser_class
from rapid_llm.frontend.tool_parsers.forced import (
    NamedToolParser, RequiredToolParser, named_schema, required_schema)
from rapid_llm.frontend.tool_parsers.stream import ToolCallStreamer

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                       "hours": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "search.web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}},
]

PARIS = '{"city": "Paris", "days": 3}'
TOKYO = '{"city": "Tōkyō \\"centre\\"", "hours": [9, 12]}'

# family -> (model text, expected content, expected [(name, arguments)])
FIXTURES: dict[str, tuple[str, str | None, list[tuple[str, str]]]] = {
    "hermes": (f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {PARIS}}}\n</tool_call>\n'
               f'<tool_call>\n{{"name": "get_weather", "arguments": {TOKYO}}}\n</tool_call>',
               "Let me check.\n", [("get_weather", PARIS), ("get_weather", TOKYO)]),
    "llama3_json": (f'<|python_tag|>{{"name": "get_weather", "parameters": {PARIS}}}; '
                    f'{{"name": "search.web", "parameters": {{"query": "a; b {{c}}"}}}}',
                    "", [("get_weather", PARIS), ("search.web", '{"query": "a; b {c}"}')]),
    "mistral": (f'[TOOL_CALLS]get_weather[ARGS]{PARIS}[TOOL_CALLS]search.web[ARGS]{{"query": "x]"}}</s>',
                "", [("get_weather", PARIS), ("search.web", '{"query": "x]"}')]),
    "qwen3_coder": ("I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
                    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
                    "<parameter=hours>\n[9, 12]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
                    "<function=search.web>\n</function>\n</tool_call>",
                    "I will look.\n",
                    [("get_weather", '{"city": "New\\nYork", "days": 3, "metric": true, "hours": [9, 12]}'),
                     ("search.web", "{}")]),
    "deepseek_v3": ("Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                    f"```json\n{PARIS}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                    f"get_weather\n```json\n{TOKYO}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                    "Checking.", [("get_weather", PARIS), ("get_weather", TOKYO)]),
    "deepseek_v31": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     f"{PARIS}<｜tool▁call▁end｜><｜tool▁call▁begin｜>search.web<｜tool▁sep｜>"
                     '{"query": "x"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
                     "", [("get_weather", PARIS), ("search.web", '{"query": "x"}')]),
    "pythonic": ("[get_weather(city='Paris', days=3), search.web(query=\"it's (a) [test], ok\"), "
                 "get_weather(city=\"Rome\", hours=[9, 12], metric=None)]",
                 "", [("get_weather", PARIS), ("search.web", '{"query": "it\'s (a) [test], ok"}'),
                      ("get_weather", '{"city": "Rome", "hours": [9, 12], "metric": null}')]),
}

# Texts each family must leave as plain content.
NOT_CALLS: dict[str, list[str]] = {
    "hermes": ["Just text.", "A <tool_call> that is not JSON", '<tool_call>\n{"arguments": {}}\n</tool_call>',
               '<tool_call>{"name": "get_weather", "id": bogus, "arguments": {}}</tool_call>',
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'],
    "llama3_json": ['{"answer": 42}', "Plain words.", '{"name": "get_weather", "parameters": [1]}'],
    "mistral": ["No calls.", "[TOOL_CALLS]not a name![ARGS]{}", "[TOOL_CALLS]get_weather[ARGS]{\"city\": "],
    "qwen3_coder": ["<tool_call>\n<notafunction>", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\nno fence",
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get weather<｜tool▁sep｜>{}<｜tool▁call▁end｜>"],
    "pythonic": ["[1, 2, 3]", "[get_weather(city=paris)]", "[get_weather(city='Paris')", "Sure: [f(x=1)]"],
}


def _parser(family: str) -> ToolParser:
    return parser_class(family)(TOOLS)


def _calls(result: Any) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in result.calls]


def _stream(parser: ToolParser, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[list[dict[str, Any]]]]:
    """Feed `pieces` (the last one final); the concatenated content, the calls the deltas add up to,
    and every non-empty tool_calls delta."""
    streamer = ToolCallStreamer(parser)
    content, calls, deltas = "", {}, []
    for number, piece in enumerate(pieces):
        new_content, entries = streamer.feed(piece, final=number == len(pieces) - 1)
        content += new_content
        if entries:
            deltas.append(entries)
        for entry in entries:
            if entry["index"] not in calls:
                assert set(entry) == {"index", "id", "type", "function"} and entry["type"] == "function"
                assert entry["index"] == len(calls)  # calls open in order
                calls[entry["index"]] = [entry["function"]["name"], ""]
            else:
                assert set(entry) == {"index", "function"} and set(entry["function"]) == {"arguments"}
            calls[entry["index"]][1] += entry["function"]["arguments"]
    return content, [tuple(calls[i]) for i in sorted(calls)], deltas


def test_every_family_is_registered() -> None:
    assert set(TOOL_PARSERS) == set(FIXTURES) == {"hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v3",
                                                  "deepseek_v31", "pythonic"}
    with pytest.raises(ValueError, match="--tool-call-parser 'nope' is not one of deepseek_v3, deepseek_v31, hermes"):
        parser_class("nope")


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_non_streamed(family: str) -> None:
    text, content, calls = FIXTURES[family]
    result = _parser(family).parse(text, final=True)
    assert (result.content, _calls(result)) == (content, calls)
    for _, arguments in calls:
        assert isinstance(json.loads(arguments), dict)


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_streamed_splits_at_every_position_add_up_to_the_non_streamed_result(family: str) -> None:
    text, content, calls = FIXTURES[family]
    for cut in range(len(text) + 1):
        got = _stream(_parser(family), [text[:cut], text[cut:]])
        assert got[:2] == (content, calls), f"split at {cut}: {text[:cut]!r}"
    for first in range(0, len(text), 7):  # three pieces: boundaries inside names and arguments at once
        for second in range(first, len(text), 11):
            got = _stream(_parser(family), [text[:first], text[first:second], text[second:]])
            assert got[:2] == (content, calls), f"splits at {first}, {second}"


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_streamed_one_character_at_a_time_sends_argument_fragments(family: str) -> None:
    text, content, calls = FIXTURES[family]
    got_content, got_calls, deltas = _stream(_parser(family), [*text, ""])
    assert (got_content, got_calls) == (content, calls)
    fragments = [entry for entries in deltas for entry in entries if "id" not in entry]
    assert len(fragments) >= len(calls)  # arguments arrive after the opening entry, not all at once


@pytest.mark.parametrize("family", sorted(NOT_CALLS))
def test_text_that_is_no_call_is_content(family: str) -> None:
    for text in NOT_CALLS[family]:
        result = _parser(family).parse(text, final=True)
        assert (result.content, result.calls) == (text, []), text


@pytest.mark.parametrize("family", sorted(FIXTURES))
def test_plain_text_streams_unchanged(family: str) -> None:
    text = "The weather is fine; no tools needed [really]."
    for cut in range(len(text) + 1):
        assert _stream(_parser(family), [text[:cut], text[cut:]])[:2] == (text, [])


def test_hermes_holds_back_only_what_may_start_a_call() -> None:
    parser = _parser("hermes")
    assert parser.parse("Hello <tool", final=False).content == "Hello "
    assert parser.parse("Hello <tool", final=True).content == "Hello <tool"
    assert parser.parse("Hello <b>", final=False).content == "Hello <b>"


def test_hermes_accepts_a_call_whose_end_tag_never_came() -> None:
    result = _parser("hermes").parse(f'<tool_call>{{"name": "get_weather", "arguments": {PARIS}}}', final=True)
    assert _calls(result) == [("get_weather", PARIS)]


def test_arguments_sent_as_a_json_string_are_decoded() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>'
    assert _calls(_parser("hermes").parse(text, final=True)) == [("get_weather", '{"city": "Paris"}')]
    assert _stream(_parser("hermes"), [*text, ""])[1] == [("get_weather", '{"city": "Paris"}')]


def test_mistral_array_format_and_its_ids() -> None:
    text = (f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {PARIS}}}, '
            '{"name": "search.web", "arguments": {}}]')
    parser = _parser("mistral")
    assert _calls(parser.parse(text, final=True)) == [("get_weather", PARIS), ("search.web", "{}")]
    assert parser.keeps_special_tokens
    call_id = parser.make_call_id()
    assert len(call_id) == 9 and call_id.isalnum()


def test_qwen3_coder_types_values_by_the_schema() -> None:
    text = ("<tool_call><function=get_weather><parameter=city>\n42\n</parameter><parameter=days>\nmany\n</parameter>"
            "<parameter=extra>\n7\n</parameter></function></tool_call>")
    # A string parameter stays a string, a value that is not its type stays as written, an unknown one too.
    assert _calls(_parser("qwen3_coder").parse(text, final=True)) == [
        ("get_weather", '{"city": "42", "days": "many", "extra": "7"}')]


def test_required_schema_and_output() -> None:
    schema = required_schema(TOOLS, parallel_tool_calls=True)
    output = f'[{{"name": "get_weather", "parameters": {PARIS}}}, {{"name": "search.web", "parameters": {{}}}}]'
    jsonschema.validate(json.loads(output), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_weather", "parameters": {"days": 3}}], schema)  # city is required
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "other", "parameters": {}}], schema)
    single = required_schema(TOOLS, parallel_tool_calls=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(output), single)
    result = RequiredToolParser(TOOLS).parse(output, final=True)
    assert (result.content, _calls(result)) == ("", [("get_weather", PARIS), ("search.web", "{}")])
    for cut in range(len(output) + 1):
        assert _stream(RequiredToolParser(TOOLS), [output[:cut], output[cut:]])[1] == _calls(result)


def test_required_schema_lifts_defs_to_the_root() -> None:
    unit = {"type": "string", "enum": ["C", "F"]}
    tools = [{"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"unit": {"$ref": "#/$defs/unit"}}, "$defs": {"unit": unit}}}}
        for name in ("a", "b")]
    schema = required_schema(tools, parallel_tool_calls=True)
    assert schema["$defs"] == {"unit": unit}
    jsonschema.validate([{"name": "b", "parameters": {"unit": "C"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "b", "parameters": {"unit": "K"}}], schema)
    tools[1]["function"]["parameters"]["$defs"] = {"unit": {"type": "integer"}}
    with pytest.raises(OpenAIError, match="define \\$defs 'unit' differently"):
        required_schema(tools, parallel_tool_calls=True)


def test_named_schema_and_output() -> None:
    assert named_schema(TOOLS, "get_weather") == TOOLS[0]["function"]["parameters"]
    assert named_schema([{"type": "function", "function": {"name": "f"}}], "f") == {"type": "object", "properties": {}}
    with pytest.raises(OpenAIError, match="'nope', which is not among the tools"):
        named_schema(TOOLS, "nope")
    output = f" \n{PARIS}\n "
    result = NamedToolParser(TOOLS, "get_weather").parse(output, final=True)
    assert _calls(result) == [("get_weather", PARIS)]
    for cut in range(len(output) + 1):
        assert _stream(NamedToolParser(TOOLS, "get_weather"), [output[:cut], output[cut:]])[1] == _calls(result)


def test_parallel_tool_calls_off_keeps_the_first_call() -> None:
    text = FIXTURES["hermes"][0]
    streamer = ToolCallStreamer(_parser("hermes"), parallel_tool_calls=False)
    _, entries = streamer.feed(text, final=True)
    assert [entry["index"] for entry in entries] == [0]
