"""/v1/responses against the in-process fake engine: the translation to a chat request and back, the
event stream, stored conversations and errors, through httpx and the real `openai` SDK."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import httpx
import msgspec
import openai
import pytest

from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.protocol import ChatMessage
from rapid_llm.frontend.responses_output import ResponseShape, ResponsesEvents, output_items
from rapid_llm.frontend.responses_protocol import ResponsesRequest, chat_request
from rapid_llm.frontend.serving_responses import ResponseStore
from tests.unit.fake_engine import REPLIES
from tests.unit.http_helpers import assert_error, http_client
from tests.unit.test_frontend_tools import ScriptedEngine
from tests.unit.tool_fixtures import TOOL_TEMPLATE

TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL_ARGUMENTS = '{"city": "Paris"}'


@pytest.fixture
def engine(tokenizer: Any) -> ScriptedEngine:
    engine = ScriptedEngine(tokenizer, max_model_len=512)
    engine.script = REPLIES[0]
    return engine


@pytest.fixture
async def client(engine: ScriptedEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(build_app(engine, FrontendOptions(chat_template=TOOL_TEMPLATE))) as http:
        yield http


@pytest.fixture
def sdk(client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=client, max_retries=0)


def decode(body: dict[str, Any]) -> ResponsesRequest:
    return msgspec.convert(body, ResponsesRequest)


# ---- translation -------------------------------------------------------------------------------


def test_input_items_become_chat_turns() -> None:
    history = [ChatMessage(role="user", content="Before"), ChatMessage(role="assistant", content="Earlier")]
    body = decode({"instructions": "Be brief", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
                   "max_output_tokens": 7, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
                   "input": [
                       {"role": "user", "content": [{"type": "input_text", "text": "Weather"},
                                                    {"type": "input_text", "text": "in Paris?"}]},
                       {"type": "reasoning", "summary": []},
                       {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                       {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": CALL_ARGUMENTS},
                       {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "18 C"}]})
    chat, conversation = chat_request(body, history)
    turns = [(m.role, m.content, [c.id for c in m.tool_calls or []], m.tool_call_id) for m in chat.messages]
    assert turns == [("system", "Be brief", [], None), ("user", "Before", [], None), ("assistant", "Earlier", [], None),
                     ("user", "Weather\nin Paris?", [], None), ("assistant", "Checking.", ["c1", "c2"], None),
                     ("tool", "18 C", [], "c1")]
    assert conversation.sources == ["instructions", "previous_response_id", "previous_response_id", "input[0]",
                                    "input[2]", "input[5]"]
    assert chat.tool_dicts == [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    assert chat.resolved_tool_choice.function.name == "get_weather"
    assert (chat.requested_max_tokens, chat.response_format.json_schema.name) == (7, "x")
    assert chat.include_usage is False and chat.stream_options.include_usage  # asked; used when streaming
    assert history[1].tool_calls is None  # a stored turn is never changed by a later request


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "web_search_call"}, "input[0].type"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}, "input[0].content[0].type"),
    ({"role": "tool", "content": "x"}, "input[0].role"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}, "input[0].arguments"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[0].call_id"),
    ({"type": "function_call_output", "call_id": "c"}, "input[0].output"),
])
def test_unsupported_input_names_the_field(item: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        chat_request(decode({"input": [item]}), [])
    assert (error.value.status, error.value.param) == (400, param)


def test_output_items_of_a_chat_message() -> None:
    message = {"role": "assistant", "content": "Let me see.", "reasoning_content": "Think first.",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": CALL_ARGUMENTS}}]}
    items = output_items(message, "tool_calls")
    assert [item["type"] for item in items] == ["reasoning", "message", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Think first."}]
    assert items[1]["content"][0]["text"] == "Let me see."
    assert (items[2]["call_id"], items[2]["arguments"], items[2]["status"]) == ("call_1", CALL_ARGUMENTS, "completed")
    assert [item["type"] for item in output_items({"content": None}, "length")] == ["message"]
    assert output_items({"content": "cut"}, "length")[0]["status"] == "incomplete"


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def test_stream_events_open_and_close_items_in_order() -> None:
    done: list[dict[str, Any]] = []
    events = ResponsesEvents(ResponseShape(decode({"input": "x"}), "tiny"), done.append)
    chunks = [chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "Hmm"}),
              chunk({"content": "Sure."}),
              chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": '{"ci'}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}, "tool_calls"),
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}]
    frames = [frame for c in chunks for frame in events.events(c)] + events.finish()
    payloads = [json.loads(frame.split(b"data: ", 1)[1]) for frame in frames]
    assert all(frame.startswith(f"event: {p['type']}\n".encode()) for frame, p in zip(frames, payloads))
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert [(p["type"], p.get("output_index")) for p in payloads] == [
        ("response.created", None), ("response.in_progress", None),
        ("response.output_item.added", 0), ("response.content_part.added", 0), ("response.reasoning_text.delta", 0),
        ("response.reasoning_text.done", 0), ("response.content_part.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.content_part.added", 1), ("response.output_text.delta", 1),
        ("response.output_text.done", 1), ("response.content_part.done", 1), ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2), ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2), ("response.completed", None)]
    final = payloads[-1]["response"]
    assert final == done[0] and final["status"] == "completed"
    assert final["output"][2]["arguments"] == CALL_ARGUMENTS
    assert final["usage"]["input_tokens"] == 3 and final["usage"]["total_tokens"] == 7


# ---- through the HTTP app ----------------------------------------------------------------------


async def test_sdk_response_and_stream_agree(sdk: openai.AsyncOpenAI, engine: ScriptedEngine) -> None:
    response = await sdk.responses.create(model="tiny", input="Hello", instructions="Be brief", temperature=0.5)
    assert (response.status, response.output_text, response.instructions) == ("completed", REPLIES[0], "Be brief")
    [(_, prompt_ids, params)] = engine.requests
    assert engine.tokenizer.decode(prompt_ids).startswith("<|im_start|>system\nBe brief")
    assert params.temperature == 0.5
    assert response.usage.input_tokens == len(prompt_ids)
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    stream = await sdk.responses.create(model="tiny", input="Hello", instructions="Be brief", stream=True)
    events = [event async for event in stream]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == REPLIES[0]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == REPLIES[0] and events[-1].response.usage == response.usage


async def test_max_output_tokens_leaves_the_response_incomplete(sdk: openai.AsyncOpenAI) -> None:
    response = await sdk.responses.create(model="tiny", input="Hello", max_output_tokens=2)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    stream = await sdk.responses.create(model="tiny", input="Hello", max_output_tokens=2, stream=True)
    assert [event async for event in stream][-1].type == "response.incomplete"


async def test_named_tool_choice_returns_a_function_call(sdk: openai.AsyncOpenAI, engine: ScriptedEngine) -> None:
    engine.script = CALL_ARGUMENTS  # a named function's whole output is its arguments
    kwargs = dict(model="tiny", input="Weather?", tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
    response = await sdk.responses.create(**kwargs)
    [call] = response.output
    assert (call.type, call.name, call.arguments) == ("function_call", "get_weather", CALL_ARGUMENTS)
    assert engine.requests[0][2].structured_outputs is not None  # constrained by the tool's schema
    events = [event async for event in await sdk.responses.create(stream=True, **kwargs)]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == CALL_ARGUMENTS
    engine.script = "It is sunny."
    answer = await sdk.responses.create(model="tiny", previous_response_id=response.id, tools=[TOOL], tool_choice="none",
                                        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    prompt = engine.tokenizer.decode(engine.requests[-1][1])
    assert '"arguments": {"city": "Paris"}' in prompt and "<tool_response>\n18 C" in prompt
    assert answer.output_text == "It is sunny."


async def test_previous_response_id_continues_the_conversation(sdk: openai.AsyncOpenAI, engine: ScriptedEngine) -> None:
    first = await sdk.responses.create(model="tiny", input="Hello", instructions="Only the first time")
    second = await sdk.responses.create(model="tiny", input="And?", previous_response_id=first.id)
    prompt = engine.tokenizer.decode(engine.requests[-1][1])
    assert prompt.index("Hello") < prompt.index(REPLIES[0]) < prompt.index("And?")
    assert "Only the first time" not in prompt  # instructions are not carried over (as OpenAI)
    await sdk.responses.create(model="tiny", input="More", previous_response_id=second.id)
    assert engine.tokenizer.decode(engine.requests[-1][1]).count(REPLIES[0]) == 2
    unstored = await sdk.responses.create(model="tiny", input="Hi", store=False)
    for missing in (unstored.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError) as error:
            await sdk.responses.create(model="tiny", input="x", previous_response_id=missing)
        assert error.value.body["param"] == "previous_response_id"


async def test_a_stored_response_is_retrieved_and_deleted(sdk: openai.AsyncOpenAI) -> None:
    created = await sdk.responses.create(model="tiny", input="Hello")
    retrieved = await sdk.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump()
    await sdk.responses.delete(created.id)
    for call in (sdk.responses.retrieve, sdk.responses.delete):
        with pytest.raises(openai.NotFoundError) as error:
            await call(created.id)
        assert error.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.create(model="tiny", input="x", previous_response_id=created.id)
    unstored = await sdk.responses.create(model="tiny", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(unstored.id)


def test_the_store_keeps_the_most_recently_used() -> None:
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(name, [])
    store.get("a")
    store.put("c", [])
    store.get("a"), store.get("c")
    with pytest.raises(OpenAIError):
        store.get("b")


@pytest.mark.parametrize(("body", "param"), [
    ({}, "input"),
    ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": "x", "temperature": -1}, "temperature"),
    ({"input": [{"role": "user"}]}, "input[0]"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
])
async def test_bad_requests_name_the_field(client: httpx.AsyncClient, body: dict[str, Any], param: str) -> None:
    assert_error(await client.post("/v1/responses", json=body), 400, param)


async def test_a_failure_mid_stream_is_response_failed(client: httpx.AsyncClient, engine: ScriptedEngine) -> None:
    engine.fail_after = 1
    response = await client.post("/v1/responses", json={"input": "Hi", "stream": True})
    frames = [frame for frame in response.text.split("\n\n") if frame]
    last = json.loads(frames[-1].split("data: ", 1)[1])
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert "request id" in last["response"]["error"]["message"]
    assert json.loads(frames[-2].split("data: ", 1)[1])["type"] == "response.output_item.done"


async def test_reasoning_becomes_a_reasoning_item(engine: ScriptedEngine) -> None:
    engine.script = "<think>Paris, surely.</think>It is Paris."
    options = FrontendOptions(chat_template=TOOL_TEMPLATE, reasoning_parser="qwen3")
    async with http_client(build_app(engine, options)) as http:
        sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
        response = await sdk.responses.create(model="tiny", input="Capital?")
        events = [event async for event in await sdk.responses.create(model="tiny", input="Capital?", stream=True)]
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert (response.output[0].content[0].text, response.output_text) == ("Paris, surely.", "It is Paris.")
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Paris, surely."
    assert events[-1].response.output[0].content == response.output[0].content
