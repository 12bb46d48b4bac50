"""Structured output through the real server and the openai SDK: response_format json_schema on chat,
vLLM's extras on completions, streamed text identical to non-streamed, and a schema xgrammar rejects
answered with a 400 naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.e2e.structured_cases import CHOICES, MAX_TOKENS, REGEXES, SCHEMAS

CHAT_SCHEMAS = ["nested_objects", "array_of_objects", "optional_properties", "number_bounds", "mixed_enum_const"]
MESSAGES = [{"role": "user", "content": "Give me the record."}]


def json_schema_format(name: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def streamed_chat_text(client: openai.OpenAI, **request: object) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("name", CHAT_SCHEMAS)
def test_chat_json_schema_streamed_and_not(client: openai.OpenAI, name: str) -> None:
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0.0,
               "response_format": json_schema_format(name)}
    response = client.chat.completions.create(**request)
    [choice] = response.choices
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])
    assert streamed_chat_text(client, **request) == (choice.message.content, "stop")


def test_seeded_sampled_choices_are_valid_and_reproducible(client: openai.OpenAI) -> None:
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 7,
               "n": 4, "response_format": json_schema_format("array_of_enums")}
    texts = [choice.message.content for choice in client.chat.completions.create(**request).choices]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMAS["array_of_enums"])
    assert [choice.message.content for choice in client.chat.completions.create(**request).choices] == texts


@pytest.mark.parametrize("extra", [{"guided_regex": REGEXES[1]}, {"structured_outputs": {"regex": REGEXES[2]}},
                                   {"guided_choice": CHOICES[0]}, {"guided_json": SCHEMAS["any_of"]},
                                   {"structured_outputs": {"grammar": 'root ::= "[" ("0" | "1") "]"'}}])
def test_completions_extras_streamed_and_not(client: openai.OpenAI, extra: dict) -> None:
    request = {"model": "tiny", "prompt": "Answer:", "max_tokens": 60, "temperature": 1.0, "seed": 3,
               "extra_body": extra}
    [choice] = client.completions.create(**request).choices
    assert choice.finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **request) if c.choices)
    assert streamed == choice.text
    if "guided_regex" in extra or "structured_outputs" in extra and "regex" in extra["structured_outputs"]:
        assert re.fullmatch(extra.get("guided_regex") or extra["structured_outputs"]["regex"], choice.text)
    elif "guided_choice" in extra:
        assert choice.text in extra["guided_choice"]
    elif "guided_json" in extra:
        jsonschema.validate(json.loads(choice.text), extra["guided_json"])
    else:
        assert choice.text in ("[0]", "[1]")


def test_a_schema_xgrammar_rejects_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "properties": 3}}}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=bad)
    body = error.value.body
    assert body["param"] == "response_format.json_schema.schema" and "properties must be an object" in body["message"]
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="tiny", prompt="x", extra_body={"guided_regex": "a[", "guided_choice": ["a"]})
    assert error.value.body["param"] == "guided_choice"
