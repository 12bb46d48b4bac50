"""Tool calling and the remaining request fields on the real server through the real openai client:
a conversation with tool results renders as transformers renders it, include_stop_str_in_output
through the detokenizer process, best_of against n, /tokenize and /detokenize."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Iterator

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from tests.e2e.conftest import API_KEY
from tests.e2e.server import ServerProcess
from tests.unit.tool_fixtures import TOOL_TEMPLATE, WEATHER

PROMPT = "The server reads a request and"
# A random model fills an unbounded string until max_tokens, which cuts the JSON: bounded arguments finish.
BOUNDED_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]


@pytest.fixture(scope="module")
def tool_server(checkpoint) -> Iterator[ServerProcess]:
    with tempfile.TemporaryDirectory() as directory:
        template = Path(directory) / "tools.jinja"
        template.write_text(TOOL_TEMPLATE)
        process = ServerProcess("--model", str(checkpoint), "--served-model-name", "tiny", "--api-key", API_KEY,
                                "--chat-template", str(template), "--tool-call-parser", "hermes",
                                "--enable-auto-tool-choice", "--num-kv-blocks", "64", "--log-level", "warning")
        yield process
        process.stop()


@pytest.fixture
def tool_client(tool_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tool_server.base_url}/v1", api_key=API_KEY, max_retries=0)


def test_a_conversation_with_tool_results_renders_as_transformers_does(tool_server, tool_client, checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    history = [CONVERSATION[0], {**CONVERSATION[1], "content": "", "tool_calls": [
        {**CONVERSATION[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        CONVERSATION[2]]
    expected = tokenizer.apply_chat_template(history, tools=[WEATHER], chat_template=TOOL_TEMPLATE,
                                             add_generation_prompt=True, tokenize=False)
    tokens = httpx.post(f"{tool_server.base_url}/tokenize", headers=AUTH,
                        json={"messages": CONVERSATION, "tools": [WEATHER]}).json()["tokens"]
    assert tokens == tokenizer.encode(expected, add_special_tokens=False)
    kwargs = dict(model="tiny", messages=CONVERSATION, tools=[WEATHER], max_tokens=16, temperature=0)
    full = tool_client.chat.completions.create(**kwargs)
    assert full.usage.prompt_tokens == len(tokens)
    chunks = [c for c in tool_client.chat.completions.create(stream=True, **kwargs) if c.choices]
    # A random model writes no call (and the SDK's stream helper refuses a "length" finish); whatever it
    # writes, the stream adds up to the same message.
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert all(c.choices[0].delta.tool_calls is None for c in chunks) == (full.choices[0].message.tool_calls is None)
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_auto_tool_choice_needs_the_flag(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tiny", messages=CONVERSATION[:1], tools=[WEATHER])
    assert error.value.body["param"] == "tool_choice"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choice_always_call_with_valid_arguments(tool_client, tool_choice, stream) -> None:
    # One call at most (parallel_tool_calls=False): a random model would append calls until max_tokens.
    kwargs = dict(model="tiny", messages=CONVERSATION[:1], tools=[BOUNDED_WEATHER], tool_choice=tool_choice,
                  parallel_tool_calls=False, max_tokens=200)
    for seed in range(5):
        if stream:
            with tool_client.chat.completions.stream(seed=seed, **kwargs) as events:
                completion = events.get_final_completion()
        else:
            completion = tool_client.chat.completions.create(seed=seed, **kwargs)
        calls = completion.choices[0].message.tool_calls
        assert calls and all(call.function.name == "get_weather" for call in calls)
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), BOUNDED_WEATHER["function"]["parameters"])


def test_include_stop_str_in_output_keeps_the_stop_string(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**kwargs).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    end = text.index(stop) + len(stop)
    kwargs["extra_body"] = {"ignore_eos": True, "include_stop_str_in_output": True}
    response = client.completions.create(stop=[stop], **kwargs)
    assert (response.choices[0].text, response.choices[0].finish_reason) == (text[:end], "stop")
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **kwargs)
                       if c.choices)
    assert streamed == text[:end]


def test_best_of_answers_with_the_choice_of_highest_cumulative_logprob(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=11, logprobs=0,
                  extra_body={"ignore_eos": True})
    # Choice i of either request samples with seed + i, so best_of=4 ranks exactly these four.
    candidates = client.completions.create(n=4, **kwargs).choices
    ranked = sorted(candidates, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    best = client.completions.create(n=2, best_of=4, **kwargs)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert best.usage.completion_tokens == 4 * 12


def test_tokenize_and_detokenize(server, checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    body = httpx.post(f"{server.base_url}/tokenize", headers=AUTH, json={"model": "tiny", "prompt": PROMPT}).json()
    assert body["tokens"] == tokenizer.encode(PROMPT) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] > 0
    text = httpx.post(f"{server.base_url}/detokenize", headers=AUTH, json={"tokens": body["tokens"]}).json()
    assert text == {"prompt": tokenizer.decode(body["tokens"])}
