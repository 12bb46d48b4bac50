"""/v1/messages against the in-process fake engine: the translation to a chat request and back, the event
stream, Anthropic-shaped errors and x-api-key, through the real `anthropic` SDK (which speaks httpx2)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import anthropic
import httpx2
import msgspec
import pytest

from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.messages_protocol import MessagesRequest, MessagesTranslation
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.serving_messages import MessagesEvents, content_blocks, stop_reason
from tests.unit.fake_engine import REPLIES
from tests.unit.test_frontend_tools import ScriptedEngine
from tests.unit.test_responses_api import engine  # noqa: F401  (a fixture: replies REPLIES[0] unless scripted)
from tests.unit.tool_fixtures import TOOL_TEMPLATE

API_KEY = "secret"
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HELLO = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]}


@pytest.fixture
async def http(engine: ScriptedEngine) -> AsyncIterator[httpx2.AsyncClient]:
    app = build_app(engine, FrontendOptions(chat_template=TOOL_TEMPLATE, api_key=API_KEY))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as client:
        yield client


@pytest.fixture
def sdk(http: httpx2.AsyncClient) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url="http://test", api_key=API_KEY, http_client=http, max_retries=0)


def translate(body: dict[str, Any]) -> MessagesTranslation:
    return MessagesTranslation(msgspec.convert({"max_tokens": 9, **body}, MessagesRequest))


# ---- translation -------------------------------------------------------------------------------


def test_messages_become_chat_turns() -> None:
    translation = translate({
        "system": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief"}], "tools": [TOOL],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 100},
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "text", "text": "18 C"}]},
                                         {"type": "text", "text": "Thanks"}]}]})
    chat = translation.chat
    turns = [(m.role, m.content, m.tool_call_id) for m in chat.messages]
    assert turns == [("system", "Be\nbrief", None), ("user", "Weather?", None), ("assistant", "Checking.", None),
                     ("tool", "18 C", "t1"), ("user", "Thanks", None)]
    [call] = chat.messages[2].tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("t1", "get_weather", {"city": "Paris"})
    assert translation.sources == ["system", "messages[0]", "messages[1]", "messages[2].content[0]", "messages[2]"]
    assert chat.tool_dicts[0]["function"]["parameters"] == TOOL["input_schema"]
    assert chat.resolved_tool_choice.function.name == "get_weather" and chat.parallel_tool_calls is False
    assert (chat.stop, chat.top_k, chat.max_tokens, chat.template_kwargs) == (["END"], 5, 9, {"enable_thinking": True})
    for choice, expected in (("any", "required"), ("auto", "auto"), ("none", "none")):
        assert translate({"messages": [], "tool_choice": {"type": choice}}).chat.tool_choice == expected


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
     "messages[0].content[0].type"),
    ({"system": [{"type": "image"}], "messages": []}, "system[0].type"),
    ({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"messages": [], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
])
def test_unsupported_input_names_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as error:
        translate(body)
    assert (error.value.status, error.value.param) == (400, param)


def test_stop_reasons_and_content_blocks() -> None:
    assert stop_reason("stop", None, ["END"]) == ("end_turn", None)
    assert stop_reason("stop", "END", ["END"]) == ("stop_sequence", "END")
    assert stop_reason("stop", 7, None) == ("end_turn", None)  # a stop token id is the model's own end
    assert stop_reason("length", None, None) == ("max_tokens", None)
    assert stop_reason("tool_calls", None, None) == ("tool_use", None)
    message = {"content": "Sure.", "reasoning_content": "Think.", "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "c2", "function": {"name": "f", "arguments": '{"a": '}}]}  # cut off by max_tokens
    assert content_blocks(message) == [{"type": "thinking", "thinking": "Think.", "signature": ""},
                                       {"type": "text", "text": "Sure."},
                                       {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                                       {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]


def test_stream_events_per_block() -> None:
    events = MessagesEvents("msg_1", "tiny", 11, None)
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
              {"choices": [{"delta": {"reasoning_content": "Hmm"}, "finish_reason": None}]},
              {"choices": [{"delta": {"content": "Ok"}, "finish_reason": None}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                      "function": {"name": "f", "arguments": '{"a"'}}]},
                            "finish_reason": "tool_calls"}]},
              {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17}}]
    frames = [frame for chunk in chunks for frame in events.events(chunk)] + events.finish()
    payloads = [json.loads(frame.split(b"data: ", 1)[1]) for frame in frames]
    assert all(frame.startswith(f"event: {p['type']}\n".encode()) for frame, p in zip(frames, payloads))
    assert [(p["type"], p.get("index"), (p.get("delta") or {}).get("type")) for p in payloads] == [
        ("message_start", None, None),
        ("content_block_start", 0, None), ("content_block_delta", 0, "thinking_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, None), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, None), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None), ("message_delta", None, None), ("message_stop", None, None)]
    assert payloads[0]["message"]["usage"] == {"input_tokens": 11, "output_tokens": 0}
    assert payloads[7]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    assert payloads[-2]["delta"]["stop_reason"] == "tool_use" and payloads[-2]["usage"] == {"output_tokens": 6}


# ---- through the HTTP app ----------------------------------------------------------------------


async def test_sdk_message_and_stream_agree(sdk: anthropic.AsyncAnthropic, engine: ScriptedEngine) -> None:
    message = await sdk.messages.create(system="Be brief", extra_body={"temperature": 0.5}, **HELLO)
    assert [(block.type, block.text) for block in message.content] == [("text", REPLIES[0])]
    assert (message.role, message.stop_reason, message.model) == ("assistant", "end_turn", "tiny")
    [(_, prompt_ids, params)] = engine.requests
    assert engine.tokenizer.decode(prompt_ids).startswith("<|im_start|>system\nBe brief")
    assert (params.temperature, message.usage.input_tokens) == (0.5, len(prompt_ids))
    async with sdk.messages.stream(system="Be brief", extra_body={"temperature": 0.5}, **HELLO) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == REPLIES[0] and [block.text for block in final.content] == [REPLIES[0]]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (len(prompt_ids), message.usage.output_tokens)
    cut = await sdk.messages.create(**{**HELLO, "max_tokens": 2})
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


async def test_forced_tool_use_round_trip(sdk: anthropic.AsyncAnthropic, engine: ScriptedEngine) -> None:
    engine.script = '{"city": "Paris"}'  # a named function's whole output is its arguments
    kwargs = dict(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}, **HELLO)
    message = await sdk.messages.create(**kwargs)
    [tool_use] = message.content
    assert (message.stop_reason, tool_use.type, tool_use.name, tool_use.input) == (
        "tool_use", "tool_use", "get_weather", {"city": "Paris"})
    assert engine.requests[0][2].structured_outputs is not None  # constrained by the tool's schema
    async with sdk.messages.stream(**kwargs) as stream:
        assert (await stream.get_final_message()).content[0].input == {"city": "Paris"}
    engine.script = "It is sunny."
    history = [*HELLO["messages"], {"role": "assistant", "content": [tool_use.model_dump()]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "18 C"}]}]
    answer = await sdk.messages.create(**{**HELLO, "messages": history, "tools": [TOOL], "tool_choice": {"type": "none"}})
    prompt = engine.tokenizer.decode(engine.requests[-1][1])
    assert '"arguments": {"city": "Paris"}' in prompt and "<tool_response>\n18 C" in prompt
    assert answer.content[0].text == "It is sunny."


def anthropic_error(response: httpx2.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    return body["error"]["message"]


@pytest.mark.parametrize(("body", "status", "error_type", "named"), [
    ({"messages": HELLO["messages"]}, 400, "invalid_request_error", "max_tokens"),
    ({**HELLO, "max_tokens": "many"}, 400, "invalid_request_error", "max_tokens"),
    ({**HELLO, "max_tokens": 100000}, 400, "invalid_request_error", "max_tokens"),
    ({**HELLO, "temperature": -1}, 400, "invalid_request_error", "temperature"),
    ({**HELLO, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, 400, "invalid_request_error",
     "messages[0].content[0].type"),
    ({**HELLO, "tools": [TOOL]}, 400, "invalid_request_error", "tool_choice"),  # auto needs the server flags
    ({**HELLO, "model": "claude-opus"}, 404, "not_found_error", "claude-opus"),
])
async def test_errors_are_anthropic_shaped(http: httpx2.AsyncClient, body: dict[str, Any], status: int,
                                           error_type: str, named: str) -> None:
    response = await http.post("/v1/messages", json=body, headers={"x-api-key": API_KEY})
    assert named in anthropic_error(response, status, error_type)


async def test_x_api_key_is_honoured_like_bearer(http: httpx2.AsyncClient, sdk: anthropic.AsyncAnthropic) -> None:
    anthropic_error(await http.post("/v1/messages", json=HELLO), 401, "authentication_error")
    anthropic_error(await http.post("/v1/messages", json=HELLO, headers={"x-api-key": "wrong"}), 401,
                    "authentication_error")
    assert (await http.post("/v1/messages", json=HELLO, headers={"Authorization": f"Bearer {API_KEY}"})).status_code == 200
    chat = {"messages": HELLO["messages"]}
    assert (await http.post("/v1/chat/completions", json=chat, headers={"x-api-key": API_KEY})).status_code == 200
    assert (await http.post("/v1/chat/completions", json=chat)).json()["error"]["code"] == "invalid_api_key"
    wrong = anthropic.AsyncAnthropic(base_url="http://test", api_key="wrong", http_client=http, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await wrong.messages.create(**HELLO)


async def test_a_failure_mid_stream_is_an_error_event(http: httpx2.AsyncClient, engine: ScriptedEngine) -> None:
    engine.fail_after = 1
    response = await http.post("/v1/messages", json={**HELLO, "stream": True}, headers={"x-api-key": API_KEY})
    frames = [frame for frame in response.text.split("\n\n") if frame]
    assert frames[-1].startswith("event: error\n")
    assert json.loads(frames[-1].split("data: ", 1)[1])["error"]["type"] == "api_error"
    assert frames[-2].startswith("event: content_block_stop\n")
    anthropic_error(await http.post("/v1/messages", json=HELLO, headers={"x-api-key": API_KEY}), 500, "api_error")


async def test_reasoning_becomes_a_thinking_block(engine: ScriptedEngine) -> None:
    engine.script = "<think>Paris, surely.</think>It is Paris."
    app = build_app(engine, FrontendOptions(chat_template=TOOL_TEMPLATE, reasoning_parser="qwen3"))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        sdk = anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", http_client=http, max_retries=0)
        message = await sdk.messages.create(**HELLO)
        async with sdk.messages.stream(**HELLO) as stream:
            final = await stream.get_final_message()
    assert [(block.type, getattr(block, "thinking", None) or getattr(block, "text", None)) for block in message.content] == [
        ("thinking", "Paris, surely."), ("text", "It is Paris.")]
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert (final.content[0].thinking, final.content[1].text) == ("Paris, surely.", "It is Paris.")
