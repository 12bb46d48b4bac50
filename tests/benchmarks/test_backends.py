"""Request functions against a scripted in-process SSE server: payloads and vLLM's timing rules."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

aiohttp = pytest.importorskip("aiohttp", reason="the benchmark client needs aiohttp")
from aiohttp import web  # noqa: E402

from benchmarks.common.backends import (  # noqa: E402
    RequestInput,
    open_session,
    request_openai_chat,
    request_openai_completions,
)


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def text_event(text: str) -> bytes:
    return sse({"choices": [{"index": 0, "text": text}]})


USAGE = sse({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}})
DONE = b"data: [DONE]\n\n"


def run(request_func, chunks: list[bytes], status: int = 200, path: str = "/v1/completions",
        **input_fields: Any) -> tuple[Any, dict]:
    """(outcome, payload the server received) for a server that waits 20 ms, then writes `chunks` 5 ms apart."""
    received: dict[str, Any] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        received.update(await request.json())
        response = web.StreamResponse(status=status, headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(0.02)
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.005)
        await response.write_eof()
        return response

    async def main():
        app = web.Application()
        app.router.add_post("/v1/{path:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        fields = {"api_url": f"http://127.0.0.1:{port}{path}", "model": "m", "prompt": "hi",
                  "prompt_len": 2, "output_len": 4, **input_fields}
        try:
            async with open_session() as session:
                return await request_func(session, RequestInput(**fields))
        finally:
            await runner.cleanup()

    return asyncio.run(main()), received


def test_completions_stream() -> None:
    # The second event arrives split across two network writes.
    second = text_event(" wor")
    chunks = [text_event("hel"), second[:9], second[9:], text_event("ld") + text_event(""), USAGE, DONE]
    outcome, payload = run(request_openai_completions, chunks, ignore_eos=True,
                           extra_body={"temperature": 0.0, "repetition_penalty": 1.1})
    assert outcome.success, outcome.error
    assert outcome.generated_text == "hel world"
    assert outcome.output_tokens == 4 and outcome.prompt_len == 7  # both from usage
    # Four events with choices (the last with empty text still counts, as in vLLM): TTFT + 3 ITLs.
    assert len(outcome.itl) == 3
    assert outcome.ttft >= 0.02
    assert outcome.latency == pytest.approx(outcome.ttft + sum(outcome.itl))
    assert payload["stream"] is True and payload["stream_options"] == {"include_usage": True}
    assert payload["max_tokens"] == 4 and payload["prompt"] == "hi" and payload["model"] == "m"
    assert payload["ignore_eos"] is True and payload["temperature"] == 0.0
    assert payload["repetition_penalty"] == 1.1  # --extra-body wins over the defaults


def test_chat_stream() -> None:
    def delta(content: dict[str, str]) -> bytes:
        return sse({"choices": [{"index": 0, "delta": content}]})

    chunks = [delta({"role": "assistant", "content": ""}) + delta({"content": "Hi"}), delta({"content": "!"}),
              delta({}), USAGE, DONE]
    outcome, payload = run(request_openai_chat, chunks, path="/v1/chat/completions")
    assert outcome.success, outcome.error
    assert outcome.generated_text == "Hi!"
    assert len(outcome.itl) == 3
    assert payload["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert payload["max_completion_tokens"] == 4
    assert "ignore_eos" not in payload


def test_without_usage_the_count_is_left_to_the_tokenizer() -> None:
    outcome, _ = run(request_openai_completions, [text_event("a"), text_event("b"), DONE])
    assert outcome.success and outcome.output_tokens == 0 and outcome.prompt_len == 2


def test_usage_on_the_last_choices_event_counts() -> None:
    """llama.cpp's server sends usage with the final text event, not in a `choices: []` event of its own."""
    last = sse({"choices": [{"index": 0, "text": "c", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
    outcome, _ = run(request_openai_completions, [text_event("a"), text_event("b"), last, DONE])
    assert outcome.success and outcome.generated_text == "abc"
    assert outcome.output_tokens == 3 and outcome.prompt_len == 7 and len(outcome.itl) == 2


def test_http_error_fails_the_request() -> None:
    outcome, _ = run(request_openai_completions, [b'{"error": "nope"}'], status=400)
    assert not outcome.success
    assert "400" in outcome.error and "nope" in outcome.error


@pytest.mark.parametrize(("api_key", "says"), [(None, "is not set"), ("wrong", "is not the server's key")])
def test_a_refused_key_names_openai_api_key(monkeypatch: pytest.MonkeyPatch, api_key: str | None, says: str) -> None:
    if api_key is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", api_key)
    outcome, _ = run(request_openai_completions, [b'{"error": "bad key"}'], status=401)
    assert not outcome.success
    assert "401" in outcome.error and f"OPENAI_API_KEY {says}" in outcome.error and "bad key" in outcome.error


def test_stream_without_choices_fails_the_request() -> None:
    outcome, _ = run(request_openai_completions, [USAGE, DONE])
    assert not outcome.success and "no first token" in outcome.error


def test_error_event_fails_the_request() -> None:
    outcome, _ = run(request_openai_completions, [text_event("a"), sse({"error": {"message": "died"}}), DONE])
    assert not outcome.success and "died" in outcome.error


def test_connection_error_fails_the_request() -> None:
    async def main():
        async with open_session() as session:
            request = RequestInput("http://127.0.0.1:9/v1/completions", "m", "hi", 2, 4)
            return await request_openai_completions(session, request)

    outcome = asyncio.run(main())
    assert not outcome.success and "Connect" in outcome.error
