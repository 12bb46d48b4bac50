"""The output-constraint request fields (response_format, structured_outputs, guided_*) and logit_bias, through
the HTTP frontend on a fake engine: what reaches SamplingParams, and the 400s naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rapid_llm.sampling.params import StructuredOutputsParams
from tests.unit.fake_engine import FakeEngine
from tests.unit.http_helpers import CHAT, assert_error

SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
ROUTES = [("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", CHAT)]


@pytest.mark.parametrize(("fields", "expected"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredOutputsParams(json=json.dumps(SCHEMA))),
    ({"response_format": {"type": "json_object"}}, StructuredOutputsParams(json_object=True)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}},
     StructuredOutputsParams(json_object=True)),
    ({"response_format": {"type": "text"}}, None),
    ({"structured_outputs": {"json": SCHEMA}}, StructuredOutputsParams(json=json.dumps(SCHEMA))),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, StructuredOutputsParams(json=json.dumps(SCHEMA))),
    ({"structured_outputs": {"regex": "[ab]+"}}, StructuredOutputsParams(regex="[ab]+")),
    ({"structured_outputs": {"choice": ["a", "b"]}}, StructuredOutputsParams(choice=["a", "b"])),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, StructuredOutputsParams(grammar='root ::= "a"')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutputsParams(json_object=True)),
    ({"guided_json": SCHEMA}, StructuredOutputsParams(json=json.dumps(SCHEMA))),
    ({"guided_regex": "a|b"}, StructuredOutputsParams(regex="a|b")),
    ({"guided_choice": ["yes", "no"]}, StructuredOutputsParams(choice=["yes", "no"])),
    ({"guided_grammar": 'root ::= "a" | "b"'}, StructuredOutputsParams(grammar='root ::= "a" | "b"')),
])
@pytest.mark.parametrize(("route", "body"), ROUTES)
async def test_constraint_fields_reach_the_sampling_params(client: httpx.AsyncClient, engine: FakeEngine, route: str,
                                                           body: dict[str, Any], fields: dict[str, Any],
                                                           expected: StructuredOutputsParams | None) -> None:
    response = await client.post(route, json={**body, **fields})
    assert response.status_code == 200, response.text
    assert engine.requests[-1][2].structured_outputs == expected


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema", 'Unsupported type "nonsense"'),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"structured_outputs": {"json": "[1,"}}, "structured_outputs.json", "not valid JSON"),
    ({"guided_regex": "(ab"}, "guided_regex", "parenthesis is not closed"),
    ({"structured_outputs": {"regex": "a{3,1}"}}, "structured_outputs.regex", "regex"),
    ({"guided_grammar": 'start ::= "a"'}, "guided_grammar", 'root rule with name "root" is not found'),
    ({"guided_choice": []}, "guided_choice", "at least one string"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs a json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "Invalid enum value"),
    ({"structured_outputs": {}}, "structured_outputs", "sets no constraint"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one structured output"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice", "only one"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "only one"),
    ({"guided_choice": "yes"}, "guided_choice", "Expected `array"),
])
async def test_bad_constraints_are_400s_naming_the_field(client: httpx.AsyncClient, engine: FakeEngine,
                                                         fields: dict[str, Any], param: str, says: str) -> None:
    for route, body in ROUTES:
        message = assert_error(await client.post(route, json={**body, **fields}), 400, param)
        assert says in message, message
    assert engine.requests == []


async def test_logit_bias_reaches_the_sampling_params(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    for route, body in ROUTES:
        response = await client.post(route, json={**body, "logit_bias": {"5": 10, "7": -100}})
        assert response.status_code == 200, response.text
        assert engine.requests[-1][2].logit_bias == {5: 10.0, 7: -100.0}


@pytest.mark.parametrize(("logit_bias", "says"), [
    ({"five": 1}, "token ids"), ({"5": 100.5}, "[-100, 100]"), ({"-1": 1}, "[-100, 100]"),
    ({"99999": 1}, "outside the vocabulary"), ({"5": "x"}, "Expected `float`"),
])
async def test_bad_logit_bias_is_a_400(client: httpx.AsyncClient, logit_bias: dict[str, Any], says: str) -> None:
    for route, body in ROUTES:
        message = assert_error(await client.post(route, json={**body, "logit_bias": logit_bias}), 400,
                               "logit_bias" if "Expected" not in says else "logit_bias[...]")
        assert says in message, message
