"""Tool calling, best_of and the tokenizer routes through the HTTP app and the real `openai` SDK, on an
engine whose reply text the test sets (a random model would never write a tool call)."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import httpx
import openai
import pytest

from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.protocol import ChatCompletionRequest, ChatTool, FunctionDefinition
from rapid_llm.frontend.tool_choice import plan_tools
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.params import StructuredOutputsParams
from rapid_llm.server_args import ServerArgs
from rapid_llm.utils.tiny_checkpoint import EOS_TOKEN_ID
from tests.unit.fake_engine import FakeEngine
from tests.unit.http_helpers import CHAT, assert_error, http_client, sse_payloads
from tests.unit.tool_fixtures import TOOL_TEMPLATE, WEATHER

TOOLS = [WEATHER]
HERMES_REPLY = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
AUTO = FrontendOptions(chat_template=TOOL_TEMPLATE, tool_call_parser="hermes", enable_auto_tool_choice=True)


class ScriptedEngine(FakeEngine):
    """Replies with `script` (then EOS) whatever the prompt, a few tokens per delta."""

    script = HERMES_REPLY

    def reply_token_ids(self, params: SamplingParams) -> list[int]:
        return (self.tokenizer.encode(self.script) + [EOS_TOKEN_ID])[: params.max_tokens]


@pytest.fixture
def engine(tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, max_model_len=512)


@pytest.fixture
async def client(engine: ScriptedEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(build_app(engine, AUTO)) as http:
        yield http


@pytest.fixture
async def sdk(client: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=client, max_retries=0)


async def test_auto_tool_calls_through_the_sdk(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(model="tiny", tools=TOOLS, **CHAT)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check.\n"
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_weather", {"city": "Rome"})]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


async def test_streamed_tool_calls_accumulate_in_the_sdk_to_the_non_streamed_ones(
    sdk: openai.AsyncOpenAI, engine: ScriptedEngine
) -> None:
    expected = (await sdk.chat.completions.create(model="tiny", tools=TOOLS, **CHAT)).choices[0]
    for tokens_per_delta in (1, 2, 5):
        engine.tokens_per_delta = tokens_per_delta
        async with sdk.chat.completions.stream(model="tiny", tools=TOOLS, **CHAT) as stream:
            chunks = [event.chunk async for event in stream if event.type == "chunk"]
            final = (await stream.get_final_completion()).choices[0]
        assert final.finish_reason == "tool_calls"
        assert final.message.content == expected.message.content
        assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
            (c.function.name, c.function.arguments) for c in expected.message.tool_calls]
        deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
        assert deltas[0].role == "assistant"
        entries = [entry for delta in deltas for entry in delta.tool_calls or []]
        openings = [entry for entry in entries if entry.id is not None]
        assert [(e.index, e.type, e.function.name) for e in openings] == [(0, "function", "get_weather"),
                                                                          (1, "function", "get_weather")]
        # After its opening entry a call only gets argument fragments.
        assert all(e.function.name is None and e.type is None for e in entries if e.id is None)


async def test_parallel_tool_calls_false_keeps_one_call(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(model="tiny", tools=TOOLS, parallel_tool_calls=False, **CHAT)
    assert len(completion.choices[0].message.tool_calls) == 1


async def test_plain_replies_with_tools_stay_content(client: httpx.AsyncClient, engine: ScriptedEngine) -> None:
    engine.script = "It is sunny in Paris."
    body = (await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS})).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny in Paris."}
    assert body["choices"][0]["finish_reason"] == "stop"
    chunks = sse_payloads(await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS, "stream": True}))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "It is sunny in Paris."


async def test_tool_choice_none_renders_the_tools_but_parses_nothing(
    client: httpx.AsyncClient, engine: ScriptedEngine
) -> None:
    body = (await client.post("/v1/chat/completions",
                              json={**CHAT, "tools": TOOLS, "tool_choice": "none"})).json()
    assert body["choices"][0]["message"]["content"] == HERMES_REPLY
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt = engine.tokenizer.decode(engine.requests[-1][1])
    assert json.dumps(WEATHER) in prompt


async def test_auto_needs_the_server_flags(engine: ScriptedEngine) -> None:
    options = FrontendOptions(chat_template=TOOL_TEMPLATE)
    async with http_client(build_app(engine, options)) as client:
        message = assert_error(await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS}), 400,
                               "tool_choice")
        assert "--enable-auto-tool-choice" in message
        # Without tool parsing the other choices still work.
        response = await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS, "tool_choice": "none"})
        assert response.status_code == 200


@pytest.mark.parametrize(("body", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls"),
])
async def test_bad_tool_requests_name_the_field(client: httpx.AsyncClient, body: dict[str, Any], param: str) -> None:
    assert_error(await client.post("/v1/chat/completions", json={**CHAT, **body}), 400, param)


async def test_required_constrains_to_the_calls_schema_and_reads_json(
    client: httpx.AsyncClient, engine: ScriptedEngine
) -> None:
    engine.script = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    body = (await client.post("/v1/chat/completions",
                              json={**CHAT, "tools": TOOLS, "tool_choice": "required"})).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        ("get_weather", '{"city": "Oslo"}')]
    constraint = engine.requests[-1][2].structured_outputs
    schema = json.loads(constraint.json)
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER["function"]["parameters"]


async def test_named_function_constrains_to_its_parameters(client: httpx.AsyncClient, engine: ScriptedEngine) -> None:
    engine.script = '{"city": "Lima"}'
    named = {"type": "function", "function": {"name": "get_weather"}}
    request = {**CHAT, "tools": TOOLS, "tool_choice": named}
    body = (await client.post("/v1/chat/completions", json=request)).json()
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_weather", '{"city": "Lima"}')
    assert json.loads(engine.requests[-1][2].structured_outputs.json) == WEATHER["function"]["parameters"]
    chunks = sse_payloads(await client.post("/v1/chat/completions", json={**request, "stream": True}))
    entries = [e for c in chunks for e in c["choices"][0]["delta"].get("tool_calls", [])]
    assert entries[0]["function"]["name"] == "get_weather"
    assert "".join(e["function"]["arguments"] for e in entries) == '{"city": "Lima"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_mistral_parsing_keeps_special_tokens(engine: ScriptedEngine) -> None:
    options = FrontendOptions(chat_template=TOOL_TEMPLATE, tool_call_parser="mistral", enable_auto_tool_choice=True)
    async with http_client(build_app(engine, options)) as client:
        await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS})
        assert engine.requests[-1][2].skip_special_tokens is False
        await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS, "tool_choice": "none"})
        assert engine.requests[-1][2].skip_special_tokens is True


async def test_a_conversation_with_tool_results_round_trips_through_the_template(
    client: httpx.AsyncClient, engine: ScriptedEngine
) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    engine.script = "It is 18 C and sunny."
    body = (await client.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS})).json()
    assert body["choices"][0]["message"]["content"] == "It is 18 C and sunny."
    expected = engine.tokenizer.apply_chat_template(
        [messages[0], {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
         messages[2]], tools=TOOLS, chat_template=TOOL_TEMPLATE, add_generation_prompt=True, tokenize=False)
    prompt = engine.tokenizer.decode(engine.requests[-1][1])
    assert prompt == expected
    # The call comes back in the model's own format, arguments as JSON (not a quoted string).
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18 C, sunny\n</tool_response>" in prompt


async def test_best_of_returns_the_n_choices_of_highest_cumulative_logprob(
    client: httpx.AsyncClient, engine: ScriptedEngine
) -> None:
    scripts = ["A much longer answer than the others.", "Short.", "Medium answer."]
    engine.reply_token_ids = lambda params: (engine.tokenizer.encode(scripts[params.seed % 3]) + [EOS_TOKEN_ID])
    body = (await client.post("/v1/completions", json={"prompt": "Hi", "best_of": 3, "n": 2, "seed": 0})).json()
    # The fake engine's logprobs fall with the position, so shorter outputs rank higher.
    assert [c["text"] for c in body["choices"]] == ["Short.", "Medium answer."]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["logprobs"] is None for c in body["choices"])  # used for ranking, not asked for
    assert [params.logprobs for _, _, params in engine.requests[-3:]] == [0, 0, 0]
    generated = sum(len(engine.tokenizer.encode(s)) + 1 for s in scripts)
    assert body["usage"]["completion_tokens"] == generated
    chat = (await client.post("/v1/chat/completions", json={**CHAT, "best_of": 3, "seed": 0, "logprobs": True})).json()
    assert [c["message"]["content"] for c in chat["choices"]] == ["Short."]
    assert chat["choices"][0]["logprobs"]["content"]


async def test_top_logprobs_up_to_20_and_user_and_include_stop_str(
    client: httpx.AsyncClient, engine: ScriptedEngine
) -> None:
    engine.script = "Hello."
    body = {**CHAT, "logprobs": True, "top_logprobs": 20, "user": "someone", "include_stop_str_in_output": True,
            "stop": ["."]}
    response = (await client.post("/v1/chat/completions", json=body)).json()
    assert len(response["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    params = engine.requests[-1][2]
    assert params.include_stop_str_in_output and params.stop == ["."]
    assert_error(await client.post("/v1/chat/completions", json={**body, "top_logprobs": 21}), 400, "top_logprobs")


async def test_tokenize_and_detokenize(client: httpx.AsyncClient, engine: ScriptedEngine) -> None:
    tokenizer = engine.tokenizer
    body = (await client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})).json()
    assert body["tokens"] == tokenizer.encode("Hello world")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(body["tokens"])
    plain = (await client.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False})).json()
    assert plain["tokens"] == tokenizer.encode("Hello world", add_special_tokens=False) and plain["token_strs"] is None
    chat = (await client.post("/tokenize", json={**CHAT, "tools": TOOLS})).json()
    await client.post("/v1/chat/completions", json={**CHAT, "tools": TOOLS, "tool_choice": "none"})
    assert chat["tokens"] == engine.requests[-1][1]  # what the chat route would send
    text = (await client.post("/detokenize", json={"tokens": body["tokens"]})).json()
    assert text == {"prompt": tokenizer.decode(body["tokens"])}
    assert_error(await client.post("/tokenize", json={}), 400, "prompt")
    assert_error(await client.post("/detokenize", json={"tokens": [10**6]}), 400, "tokens")
    assert_error(await client.post("/detokenize", json={"tokens": "x"}), 400, "tokens")


async def test_tokenizer_routes_need_the_api_key(engine: ScriptedEngine) -> None:
    async with http_client(build_app(engine, FrontendOptions(api_key="k"))) as client:
        assert_error(await client.post("/tokenize", json={"prompt": "Hi"}), 401, None, "AuthenticationError")
        response = await client.post("/detokenize", json={"tokens": [5]}, headers={"Authorization": "Bearer k"})
        assert response.status_code == 200


def test_required_and_named_refuse_a_second_constraint() -> None:
    plan = plan_tools(ChatCompletionRequest(messages=[], tools=[ChatTool(FunctionDefinition("f"))],
                                            tool_choice="required"), AUTO)
    constrained = SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+"))
    with pytest.raises(OpenAIError) as error:
        plan.apply(constrained)
    assert error.value.param == "tool_choice"
    assert json.loads(plan.apply(SamplingParams()).structured_outputs.json)["minItems"] == 1


@pytest.mark.parametrize(("flags", "message"), [
    ({"tool_call_parser": "nope"}, "--tool-call-parser 'nope' is not one of"),
    ({"enable_auto_tool_choice": True}, "--enable-auto-tool-choice needs --tool-call-parser"),
])
def test_tool_flags_are_checked_at_start_up(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(**flags).check_http()
    options = ServerArgs(tool_call_parser="pythonic", enable_auto_tool_choice=True).frontend_options({})
    assert (options.tool_call_parser, options.enable_auto_tool_choice) == ("pythonic", True)


async def test_each_of_n_streamed_choices_parses_its_own_calls(client: httpx.AsyncClient, engine: ScriptedEngine) -> None:
    engine.tokens_per_delta = 2
    request = {**CHAT, "tools": TOOLS, "n": 2, "stream": True, "logprobs": True}
    chunks = sse_payloads(await client.post("/v1/chat/completions", json=request))
    for index in (0, 1):
        choices = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        entries = [e for c in choices for e in c["delta"].get("tool_calls", [])]
        arguments = {}
        for entry in entries:
            arguments[entry["index"]] = arguments.get(entry["index"], "") + entry["function"]["arguments"]
        assert arguments == {0: '{"city": "Paris"}', 1: '{"city": "Rome"}'}
        assert "".join(c["delta"].get("content") or "" for c in choices) == "Let me check.\n"
        assert choices[-1]["finish_reason"] == "tool_calls"
        # Every generated token's logprob is sent, also while the parser holds its text back.
        logprobs = [entry for c in choices if c["logprobs"] for entry in c["logprobs"]["content"]]
        assert len(logprobs) == len(engine.reply_token_ids(SamplingParams(max_tokens=None)))


async def test_streamed_tool_calls_send_every_token_id(client: httpx.AsyncClient, engine: ScriptedEngine) -> None:
    """return_token_ids: the ids of tokens whose text the parser holds back go out too, in order."""
    engine.tokens_per_delta = 1
    request = {**CHAT, "tools": TOOLS, "stream": True, "return_token_ids": True}
    opening, *chunks = sse_payloads(await client.post("/v1/chat/completions", json=request))
    assert opening["prompt_token_ids"] == engine.requests[-1][1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [token for c in chunks for token in c["choices"][0]["token_ids"]] == engine.reply_token_ids(
        SamplingParams(max_tokens=None))
