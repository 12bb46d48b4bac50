"""The HTTP frontend against an in-process fake engine: routes, errors, streaming, aborts.

Requests go through httpx's ASGI transport (and the real `openai` SDK on top of it); disconnects are
simulated by driving the ASGI app directly, since that transport buffers whole responses.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx
import openai
import pytest

import rapid_llm
from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.options import FrontendOptions
from tests.unit.fake_engine import REPLIES, FakeEngine
from tests.unit.http_helpers import CHAT, assert_error, http_client, sse_payloads


# ---- non-streaming ---------------------------------------------------------------------------


async def test_completion(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 50})
    body = response.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion" and body["model"] == "tiny"
    [choice] = body["choices"]
    assert choice == {"index": 0, "text": REPLIES[0], "logprobs": None, "finish_reason": "stop", "stop_reason": None}
    [(request_id, prompt_ids, params)] = engine.requests
    assert request_id == f"{body['id']}-0" and prompt_ids == engine.tokenizer.encode("Hello")
    reply_tokens = len(engine.tokenizer.encode(REPLIES[0])) + 1  # with EOS
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": reply_tokens,
        "total_tokens": len(prompt_ids) + reply_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},  # always there while prefix caching is on
    }


async def test_completion_defaults_and_token_prompts(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = (await client.post("/v1/completions", json={"prompt": [[5, 6, 7]], "ignore_eos": True})).json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 16
    await client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": None, "temperature": 0})
    await client.post("/v1/completions", json={"prompt": ["Hi"], "stop": "Paris", "seed": 3, "top_k": 5})
    (_, first, p1), (_, second, p2), (_, third, p3) = engine.requests
    assert (first, p1.max_tokens, p1.ignore_eos) == ([5, 6, 7], 16, True)  # no model given: the served one
    assert (second, p2.max_tokens, p2.temperature) == ([5, 6], engine.max_model_len - 2, 0.0)
    assert (third, p3.stop, p3.seed, p3.top_k) == (engine.tokenizer.encode("Hi"), ["Paris"], 3, 5)


async def test_explicit_nulls_mean_the_defaults(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    nulls = {"n": None, "stream": None, "ignore_eos": None, "skip_special_tokens": None}
    response = await client.post("/v1/completions", json={"prompt": "Hi", "echo": None, **nulls})
    assert response.status_code == 200 and len(response.json()["choices"]) == 1
    chat = {"messages": [{"role": "user", "content": "Hi"}], "logprobs": None, **nulls}
    response = await client.post("/v1/chat/completions", json=chat)
    assert response.status_code == 200 and response.json()["choices"][0]["logprobs"] is None
    assert engine.requests[-1][2].skip_special_tokens is True


async def test_chat_completion(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    [choice] = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": REPLIES[0]}
    assert (choice["finish_reason"], choice["logprobs"]) == ("stop", None)
    [(_, prompt_ids, params)] = engine.requests
    text = engine.tokenizer.apply_chat_template(CHAT["messages"], add_generation_prompt=True, tokenize=False)
    assert prompt_ids == engine.tokenizer.encode(text, add_special_tokens=False)
    assert params.max_tokens == engine.max_model_len - len(prompt_ids)  # no max_tokens: the rest of the context


async def test_vllm_extras_pass_through(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    extras = {
        "top_p": 0.9, "top_k": 4, "min_p": 0.1, "repetition_penalty": 1.1, "frequency_penalty": 0.5,
        "presence_penalty": 0.2, "min_tokens": 1, "stop_token_ids": [7], "skip_special_tokens": False,
        "stop": ["x", "y"], "temperature": 0.5, "unknown_field": {"ignored": True},
    }
    assert (await client.post("/v1/chat/completions", json={**CHAT, **extras})).status_code == 200
    [(_, _, params)] = engine.requests
    assert {name: getattr(params, name) for name in extras if name != "unknown_field"} == {
        name: value for name, value in extras.items() if name != "unknown_field"
    }


async def test_chat_content_parts_and_max_completion_tokens(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the capital?"}]
    request = {"messages": [{"role": "user", "content": parts}], "max_tokens": 9, "max_completion_tokens": 4}
    body = (await client.post("/v1/chat/completions", json=request)).json()
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length"
    [(_, prompt_ids, _)] = engine.requests
    assert "What is\nthe capital?" in engine.tokenizer.decode(prompt_ids)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_batch_of_prompts_gives_n_choices_each(client: httpx.AsyncClient, engine: FakeEngine,
                                                       stream: bool) -> None:
    """As in vLLM: choice index = prompt index * n + i; prompt tokens summed over the prompts."""
    request = {"prompt": ["Hi", [5, 6, 7]], "n": 2, "max_tokens": 64, "stream": stream,
               "stream_options": {"include_usage": True}}
    response = await client.post("/v1/completions", json=request)
    prompts = [engine.tokenizer.encode("Hi"), [5, 6, 7]]
    assert [ids for _, ids, _ in engine.requests] == [prompts[0], prompts[0], prompts[1], prompts[1]]
    if stream:
        chunks = [json.loads(line[6:]) for line in response.text.splitlines()
                  if line.startswith("data: {")]
        indices = {choice["index"] for chunk in chunks for choice in chunk["choices"]}
        usage_total = chunks[-1]["usage"]
    else:
        indices = {choice["index"] for choice in response.json()["choices"]}
        usage_total = response.json()["usage"]
    assert indices == {0, 1, 2, 3}
    assert usage_total["prompt_tokens"] == len(prompts[0]) + len(prompts[1])


async def test_n_fans_out_with_distinct_seeds(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = (await client.post("/v1/completions", json={"prompt": "Hi", "n": 3, "seed": 0, "max_tokens": 64})).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == list(REPLIES)
    assert [(rid.rsplit("-", 1)[1], p.seed, p.n) for rid, _, p in engine.requests] == [
        ("0", 0, 1), ("1", 1, 1), ("2", 2, 1)
    ]
    prompt_tokens = len(engine.tokenizer.encode("Hi"))
    generated = sum(len(engine.tokenizer.encode(reply)) + 1 for reply in REPLIES)
    assert body["usage"]["prompt_tokens"] == prompt_tokens  # counted once, not per choice
    assert body["usage"]["completion_tokens"] == generated


async def test_cached_tokens_reported(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.num_cached_tokens = 16
    body = (await client.post("/v1/completions", json={"prompt": "Hi"})).json()
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}
    stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_payloads(await client.post("/v1/chat/completions", json=stream))
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 16}


async def test_no_cached_tokens_details_without_prefix_caching(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.enable_prefix_caching = False
    body = (await client.post("/v1/completions", json={"prompt": "Hi"})).json()
    assert body["usage"]["prompt_tokens_details"] is None


async def test_completion_logprobs(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    request = {"prompt": "Hi", "logprobs": 2, "max_tokens": 5}
    logprobs = (await client.post("/v1/completions", json=request)).json()["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert logprobs["tokens"] == [engine.tokenizer.decode([t]) for t in engine.tokenizer.encode(REPLIES[0])[:5]]
    assert logprobs["token_logprobs"] == [-0.125 * (i + 1) for i in range(5)]
    assert all(len(top) == 2 and top[token] == lp for token, lp, top in
               zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]))
    lengths = [len(token) for token in logprobs["tokens"]]
    assert logprobs["text_offset"] == [sum(lengths[:i]) for i in range(5)]
    streamed = sse_payloads(await client.post("/v1/completions", json={**request, "stream": True}))
    joined: dict[str, list[Any]] = {key: [] for key in logprobs}
    for chunk in streamed:
        for key, values in chunk["choices"][0]["logprobs"].items():
            joined[key] += values
    assert joined == logprobs


async def test_chat_logprobs(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    request = {**CHAT, "logprobs": True, "top_logprobs": 3, "max_tokens": 4}
    content = (await client.post("/v1/chat/completions", json=request)).json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode("utf-8"))
        assert len(item["top_logprobs"]) == 3 and item["top_logprobs"][0]["token"] == item["token"]
        assert all(set(top) == {"token", "logprob", "bytes"} for top in item["top_logprobs"])
    no_top = {**CHAT, "logprobs": True, "max_tokens": 2}
    content = (await client.post("/v1/chat/completions", json=no_top)).json()["choices"][0]["logprobs"]["content"]
    assert [item["top_logprobs"] for item in content] == [[], []]
    assert engine.requests[-1][2].logprobs == 0


# ---- streaming -------------------------------------------------------------------------------


async def test_completion_stream_matches_non_stream(client: httpx.AsyncClient) -> None:
    request = {"prompt": "Hi", "max_tokens": 64}
    full = (await client.post("/v1/completions", json=request)).json()["choices"][0]
    chunks = sse_payloads(await client.post("/v1/completions", json={**request, "stream": True}))
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["choices"][0]["text"] or c["choices"][0]["finish_reason"] for c in chunks)  # no empty chunks
    assert chunks[0]["choices"][0]["text"]  # the first chunk already carries text
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


async def test_chat_stream_framing(client: httpx.AsyncClient) -> None:
    full = (await client.post("/v1/chat/completions", json=CHAT)).json()
    chunks = sse_payloads(await client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all("role" not in d and d.get("content") != "" for d in deltas[1:])
    assert "".join(d.get("content", "") for d in deltas) == full["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_stream_usage_only_when_asked(client: httpx.AsyncClient) -> None:
    request = {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 7}
    chunks = sse_payloads(await client.post("/v1/chat/completions", json=request))
    assert chunks[-1]["choices"] == []
    non_stream = (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 7})).json()
    assert chunks[-1]["usage"] == non_stream["usage"]
    assert all("usage" not in c for c in chunks[:-1])
    no_usage = {**request, "stream_options": {"include_usage": False}}
    assert all(c["choices"] for c in sse_payloads(await client.post("/v1/chat/completions", json=no_usage)))


async def test_stream_n_choices_interleave(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    request = {**CHAT, "n": 2, "seed": 1, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_payloads(await client.post("/v1/chat/completions", json=request))
    choices = [c["choices"][0] for c in chunks[:-1]]
    content_order = [c["index"] for c in choices if "role" not in c["delta"]]
    assert content_order[:4] == [0, 1, 0, 1]  # arrival order, not one choice after the other
    for index, reply in enumerate(REPLIES[1:3]):
        mine = [c for c in choices if c["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == reply
        assert [c["finish_reason"] for c in mine][-1] == "stop"
    expected = sum(len(engine.tokenizer.encode(reply)) + 1 for reply in REPLIES[1:3])
    assert chunks[-1]["usage"]["completion_tokens"] == expected


# ---- the openai SDK --------------------------------------------------------------------------


async def test_openai_sdk_completions(sdk: openai.AsyncOpenAI) -> None:
    result = await sdk.completions.create(model="tiny", prompt="Hello", max_tokens=64)
    assert result.choices[0].text == REPLIES[0] and result.usage is not None
    stream = await sdk.completions.create(model="tiny", prompt="Hello", max_tokens=64, stream=True)
    assert "".join([chunk.choices[0].text async for chunk in stream]) == REPLIES[0]


async def test_openai_sdk_chat(sdk: openai.AsyncOpenAI) -> None:
    messages: Any = CHAT["messages"]
    result = await sdk.chat.completions.create(model="tiny", messages=messages, seed=2, logprobs=True, top_logprobs=1)
    assert result.choices[0].message.content == REPLIES[2]
    assert result.choices[0].logprobs is not None and result.choices[0].logprobs.content
    stream = await sdk.chat.completions.create(
        model="tiny", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == REPLIES[0]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


async def test_openai_sdk_errors(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await sdk.completions.create(model="other", prompt="Hi")
    with pytest.raises(openai.BadRequestError) as raised:
        await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=-1)
    assert raised.value.param == "temperature"  # type: ignore[attr-defined]


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"prompt": "Hi", "temperature": -1}, "temperature"),
        ("/v1/completions", {"prompt": "Hi", "top_p": 0}, "top_p"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "Hi", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "Hi", "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ("/v1/completions", {"prompt": "Hi", "stop": ["ok", ""]}, "stop"),
        ("/v1/completions", {"prompt": "Hi", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ("/v1/completions", {"max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": []}, "prompt"),
        ("/v1/completions", {"prompt": ["one", ""]}, "prompt"),
        ("/v1/completions", {"prompt": [[1, 2], [3, "x"]]}, "prompt[1][1]"),
        ("/v1/completions", {"prompt": [1, 100000]}, "prompt"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": -1}, "prompt_logprobs"),
        ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1}, "prompt_logprobs"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "Hi"}]}, "messages[0].role"),
        ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "Hi"}]}, "messages[0].tool_call_id"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content"),
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user"}]},
         "messages[1].content"),
        ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
        ("/v1/chat/completions", {**CHAT, "user": 7}, "user"),
        ("/v1/completions", {"prompt": "Hi", "n": 2, "best_of": 1}, "best_of"),
        ("/v1/completions", {"prompt": "Hi", "best_of": 129}, "best_of"),
        ("/v1/completions", {"prompt": "Hi", "best_of": 2, "stream": True}, "best_of"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        ("/v1/chat/completions", {**CHAT, "presence_penalty": 3}, "presence_penalty"),
    ],
)
async def test_bad_requests_name_the_field(
    client: httpx.AsyncClient, engine: FakeEngine, route: str, body: dict[str, Any], param: str
) -> None:
    assert_error(await client.post(route, json=body), 400, param)
    assert engine.requests == []
    assert (await client.post("/v1/completions", json={"prompt": "Hi"})).status_code == 200  # still serving


async def test_prompt_token_ids_are_checked_against_the_model_vocab_size(tokenizer: Any) -> None:
    # Ids past the tokenizer but within the model's embedding rows are valid input for the worker.
    engine = FakeEngine(tokenizer, vocab_size=len(tokenizer) + 8)
    async with http_client(build_app(engine)) as client:
        accepted = await client.post("/v1/completions", json={"prompt": [1, len(tokenizer) + 7]})
        assert accepted.status_code == 200
        refused = await client.post("/v1/completions", json={"prompt": [1, len(tokenizer) + 8]})
        assert_error(refused, 400, "prompt")
        assert f"[0, {len(tokenizer) + 8})" in refused.json()["error"]["message"]


async def test_malformed_json(client: httpx.AsyncClient) -> None:
    for body in (b"{not json", b"", b"[1, 2]"):
        response = await client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert_error(response, 400, None)


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4"})
    assert_error(response, 404, "model", "NotFoundError")
    assert response.json()["error"]["code"] == "model_not_found"


async def test_context_length(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    prompt = list(range(10, 110))  # 100 tokens of the 128-token context
    message = assert_error(await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 29}), 400,
                           "max_tokens")
    assert "128" in message and "129" in message and "100" in message and "29" in message
    assert (await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 28})).status_code == 200
    message = assert_error(await client.post("/v1/completions", json={"prompt": list(range(10, 138))}), 400, "prompt")
    assert "128" in message
    long_chat = {"messages": [{"role": "user", "content": "word " * 200}]}
    assert_error(await client.post("/v1/chat/completions", json=long_chat), 400, "messages")
    chat = {**CHAT, "max_completion_tokens": 1000}
    assert_error(await client.post("/v1/chat/completions", json=chat), 400, "max_completion_tokens")


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404, None, "NotFoundError")
    assert_error(await client.get("/v1/completions"), 405, None, "MethodNotAllowedError")


async def test_engine_failure(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after = 1
    assert_error(await client.post("/v1/completions", json={"prompt": "Hi"}), 500, None, "InternalServerError")
    chunks = sse_payloads(await client.post("/v1/completions", json={"prompt": "Hi", "stream": True}))
    assert chunks[0]["choices"][0]["text"] and chunks[-1]["error"]["type"] == "InternalServerError"
    engine.fail_after = None
    assert (await client.post("/v1/completions", json={"prompt": "Hi"})).status_code == 200


# ---- other routes, API key -------------------------------------------------------------------


async def test_models_version_health(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    models = (await client.get("/v1/models")).json()
    assert models["object"] == "list"
    [model] = models["data"]
    assert {k: model[k] for k in ("id", "object", "owned_by", "root", "max_model_len")} == {
        "id": "tiny", "object": "model", "owned_by": "rapid_llm", "root": "/models/tiny", "max_model_len": 128
    }
    assert isinstance(model["created"], int)
    assert (await client.get("/version")).json() == {"version": rapid_llm.__version__}
    assert (await client.get("/server_info")).json() == engine.server_info
    assert (await client.get("/health")).status_code == 200
    engine.healthy = False
    assert (await client.get("/health")).status_code == 503
    response = await client.post("/v1/completions", json={"prompt": "Hi"})
    assert_error(response, 503, None, "ServiceUnavailableError")


async def test_api_key(engine: FakeEngine) -> None:
    app = build_app(engine, FrontendOptions(api_key="sesame"))
    async with http_client(app) as anonymous, http_client(app, authorization="Bearer wrong") as wrong:
        for http in (anonymous, wrong):
            response = await http.post("/v1/completions", json={"prompt": "Hi"})
            assert_error(response, 401, None, "AuthenticationError")
            assert_error(await http.get("/v1/models"), 401, None, "AuthenticationError")
        for path in ("/health", "/version", "/metrics"):
            assert (await anonymous.get(path)).status_code == 200
    async with http_client(app, authorization="Bearer sesame") as allowed:
        assert (await allowed.post("/v1/completions", json={"prompt": "Hi"})).status_code == 200
        sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="wrong", http_client=allowed, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await sdk.models.list()


# ---- cache flush -----------------------------------------------------------------------------


async def test_flush_cache(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/flush_cache")
    assert (response.status_code, response.json(), engine.num_flushes) == (200, {"flushed": True}, 1)
    engine.running.add("busy")
    message = assert_error(await client.post("/flush_cache"), 400, None)
    assert "requests are running" in message and engine.num_flushes == 1
    engine.healthy = False
    assert_error(await client.post("/flush_cache"), 503, None, "ServiceUnavailableError")
    assert_error(await client.get("/flush_cache"), 405, None, "MethodNotAllowedError")


async def test_flush_cache_needs_the_api_key(engine: FakeEngine) -> None:
    async with http_client(build_app(engine, FrontendOptions(api_key="secret"))) as http:
        assert (await http.post("/flush_cache")).status_code == 401
        assert (await http.post("/flush_cache", headers={"Authorization": "Bearer secret"})).status_code == 200


# ---- client disconnects ----------------------------------------------------------------------


async def call_and_disconnect(app: Any, path: str, body: dict[str, Any], after_body_chunks: int) -> list[bytes]:
    """Drive the ASGI app directly; the client disconnects after receiving `after_body_chunks` chunks."""
    gone = asyncio.Event()
    if after_body_chunks == 0:
        gone.set()
    received: list[bytes] = []
    request_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            received.append(message["body"])
        if len(received) >= after_body_chunks:
            gone.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json")], "client": ("test", 1),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return received


async def test_stream_disconnect_aborts(engine: FakeEngine) -> None:
    engine.hold_after = 1  # one delta, then the engine goes quiet: only the disconnect can end the request
    app = build_app(engine)
    received = await call_and_disconnect(app, "/v1/chat/completions", {**CHAT, "stream": True, "n": 2}, 1)
    assert received[0].startswith(b"data: ")
    request_ids = [request_id for request_id, _, _ in engine.requests]
    assert len(request_ids) == 2
    assert sorted(engine.closed_early) == sorted(request_ids)
    async with http_client(app) as http:
        text = (await http.get("/metrics")).text
    assert 'rapid_llm:request_success_total{finished_reason="abort",model_name="tiny"} 2.0' in text


async def test_non_stream_disconnect_aborts(engine: FakeEngine) -> None:
    engine.hold_after = 0
    received = await call_and_disconnect(build_app(engine), "/v1/completions", {"prompt": "Hi"}, 0)
    assert received == []
    assert engine.closed_early == [engine.requests[0][0]]


def test_frontend_does_not_import_torch() -> None:
    code = "import sys, rapid_llm.frontend.app; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
