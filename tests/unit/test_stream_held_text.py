"""A token whose text the detokenizer holds back (an incomplete UTF-8 character) is streamed at once as an
empty chunk, as vLLM does, so a client's time to first token is when the token was made; the text follows
with the next chunk. Chat with a tool-call parser still waits until the parser knows what the text is."""

from __future__ import annotations

from typing import Any

import httpx

from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.options import FrontendOptions
from tests.unit.fake_engine import FakeEngine
from tests.unit.http_helpers import CHAT, http_client, sse_payloads
from tests.unit.tool_fixtures import TOOL_TEMPLATE, WEATHER


async def test_completion_streams_a_held_token_as_an_empty_chunk(client: httpx.AsyncClient,
                                                                 engine: FakeEngine) -> None:
    request = {"prompt": "Hi", "max_tokens": 12, "ignore_eos": True, "logprobs": 0}
    full = (await client.post("/v1/completions", json=request)).json()["choices"][0]
    engine.text_held_deltas = 1
    chunks = sse_payloads(await client.post("/v1/completions", json={**request, "stream": True}))
    choices = [chunk["choices"][0] for chunk in chunks]
    assert len(choices) == -(-12 // engine.tokens_per_delta)  # one chunk per engine delta, none withheld
    assert choices[0]["text"] == "" and len(choices[0]["logprobs"]["tokens"]) == engine.tokens_per_delta
    assert choices[1]["text"]
    assert "".join(choice["text"] for choice in choices) == full["text"]
    assert sum(len(choice["logprobs"]["tokens"]) for choice in choices) == 12


async def test_chat_streams_a_held_token_as_empty_content(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    full = (await client.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]["content"]
    engine.text_held_deltas = 1
    chunks = sse_payloads(await client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"content": ""}]
    assert "".join(delta.get("content", "") for delta in deltas) == full


async def test_chat_with_a_tool_parser_waits_for_text(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer, max_model_len=512)  # room for the tool template's prompt
    options = FrontendOptions(chat_template=TOOL_TEMPLATE, tool_call_parser="hermes", enable_auto_tool_choice=True)
    engine.text_held_deltas = 1
    async with http_client(build_app(engine, options)) as client:
        chunks = sse_payloads(await client.post("/v1/chat/completions", json={**CHAT, "tools": [WEATHER], "stream": True}))
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(delta for delta in deltas[1:-1]) and deltas[1].get("content")
