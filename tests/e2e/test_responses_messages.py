"""/v1/responses and /v1/messages on the real server (tiny random Llama) through the official `openai` and
`anthropic` clients: whole and streamed answers agree, a forced tool call round trip (the call is
grammar-constrained, so even a random model's arguments follow the schema), previous_response_id, errors
in each API's own shape, and the API key as Anthropic sends it (x-api-key)."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import API_KEY
from tests.e2e.server import ServerProcess
from tests.e2e.test_tool_calling import tool_server  # noqa: F401  (a fixture)

# Bounded arguments, so that a random model's constrained output finishes well within the token budget.
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
               "required": ["city"], "additionalProperties": False}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
                  "parameters": CITY_SCHEMA}
MESSAGES_TOOL = {"name": "get_weather", "description": "Weather of a city", "input_schema": CITY_SCHEMA}


@pytest.fixture(scope="module")
def server(tool_server: ServerProcess) -> ServerProcess:
    """conftest's `client` on a server whose chat template renders tool calls and results (the tiny model's
    own has no tool role)."""
    return tool_server


@pytest.fixture
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


# ---- /v1/responses -----------------------------------------------------------------------------


def test_responses_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", instructions="Answer briefly.", input="The server reads a request and",
                  max_output_tokens=12, temperature=0)
    response = client.responses.create(**kwargs)
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.usage.output_tokens <= 12 and response.usage.input_tokens > 0
    events = list(client.responses.create(stream=True, **kwargs))
    assert [e.type for e in events[:4]] == ["response.created", "response.in_progress", "response.output_item.added",
                                            "response.content_part.added"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert events[-1].type == f"response.{response.status}"
    streamed = events[-1].response.usage  # cached tokens differ: the second request hits the prefix cache
    assert (streamed.input_tokens, streamed.output_tokens) == (response.usage.input_tokens, response.usage.output_tokens)


def test_responses_tool_call_round_trip(client: openai.OpenAI) -> None:
    response = client.responses.create(model="tiny", input="Weather in Paris?", tools=[RESPONSES_TOOL],
                                       tool_choice={"type": "function", "name": "get_weather"},
                                       max_output_tokens=64, temperature=0)
    [call] = response.output
    assert (call.type, call.name) == ("function_call", "get_weather")
    jsonschema.validate(json.loads(call.arguments), CITY_SCHEMA)
    answer = client.responses.create(
        model="tiny", previous_response_id=response.id, tools=[RESPONSES_TOOL], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}], max_output_tokens=8)
    # The call and its output are part of the prompt now.
    assert answer.usage.input_tokens > response.usage.input_tokens + response.usage.output_tokens
    assert answer.previous_response_id == response.id and answer.output[0].type == "message"


def test_responses_errors_are_openai_shaped(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="tiny", input="x", previous_response_id="resp_not_stored")
    assert missing.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="tiny", input=[{"role": "user", "content": [{"type": "input_image",
                                                                                   "image_url": "x"}]}])
    assert bad.value.body["param"] == "input[0].content[0].type"
    assert httpx.post(f"{server.base_url}/v1/responses", json={"input": "x"}).status_code == 401


# ---- /v1/messages ------------------------------------------------------------------------------


def test_messages_whole_and_streamed_agree(claude: anthropic.Anthropic) -> None:
    kwargs = dict(model="tiny", max_tokens=12, system="Answer briefly.", extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": "The server reads a request and"}])
    message = claude.messages.create(**kwargs)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    assert 0 < message.usage.output_tokens <= 12
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == message.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (message.stop_reason, message.usage.output_tokens)


def test_messages_tool_use_round_trip(claude: anthropic.Anthropic) -> None:
    question = [{"role": "user", "content": "Weather in Paris?"}]
    message = claude.messages.create(model="tiny", max_tokens=64, messages=question, tools=[MESSAGES_TOOL],
                                     tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    [tool_use] = message.content
    assert (message.stop_reason, tool_use.type, tool_use.name) == ("tool_use", "tool_use", "get_weather")
    jsonschema.validate(tool_use.input, CITY_SCHEMA)
    history = [*question, {"role": "assistant", "content": [tool_use.model_dump(exclude_none=True)]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "18 C"}]}]
    answer = claude.messages.create(model="tiny", max_tokens=8, messages=history, tools=[MESSAGES_TOOL],
                                    tool_choice={"type": "none"})
    assert answer.usage.input_tokens > message.usage.input_tokens + message.usage.output_tokens
    assert answer.content[0].type == "text"


def test_messages_errors_are_anthropic_shaped(claude: anthropic.Anthropic, server: ServerProcess) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="tiny", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0].type" in bad.value.body["error"]["message"]
    missing = httpx.post(f"{server.base_url}/v1/messages", headers={"x-api-key": API_KEY},
                         json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]
    unauthorized = httpx.post(f"{server.base_url}/v1/messages", json={"max_tokens": 8, "messages": []})
    assert unauthorized.status_code == 401
    assert unauthorized.json() == {"type": "error", "error": {"type": "authentication_error",
                                                              "message": "Invalid or missing API key."}}
