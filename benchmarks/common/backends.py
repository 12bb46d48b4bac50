"""Streaming request functions for OpenAI-compatible `/v1/completions` and `/v1/chat/completions`.

Key design choice: the payloads and the timing rules are those of vLLM's `endpoint_request_func.py`:
the clock starts just before the request is sent; TTFT is taken at the first event whose `choices`
is non-empty; every later such event adds one ITL sample; the request ends at the last such event
(the usage event and `[DONE]` do not count); the output token count is `usage.completion_tokens`
from whichever event carries `usage` (vLLM and rapid_llm send a `choices: []` event, llama.cpp's server
puts it on the last choices event). One timestamp is taken per network read, before parsing. The
client is aiohttp, as in vLLM: its C HTTP parser costs ~20 us per streamed chunk against ~75 us for
httpx (measured here), which at tens of thousands of chunks per second would otherwise saturate the
client's core and inflate the latencies it measures.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp

from benchmarks.common.metrics import RequestOutcome
from benchmarks.common.sse import DONE, SSEParser

DEFAULT_ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
# vLLM's client timeout: long enough for any single request of a saturated run.
REQUEST_TIMEOUT_S = 6 * 60 * 60


@dataclass(frozen=True)
class RequestInput:
    api_url: str
    model: str
    prompt: str | list[int]
    prompt_len: int
    output_len: int
    ignore_eos: bool = False
    # Merged into the payload last (sampling parameters, --extra-body), so it wins.
    extra_body: dict[str, Any] | None = None


def open_session(max_concurrency: int | None = None) -> aiohttp.ClientSession:
    """A session whose kept-alive connections are reused across requests, capped like vLLM's."""
    connector = aiohttp.TCPConnector(
        limit=max_concurrency or 0, limit_per_host=max_concurrency or 0, keepalive_timeout=60
    )
    return aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    )


def auth_headers() -> dict[str, str]:
    """`Authorization: Bearer $OPENAI_API_KEY` when that variable is set, as vLLM's client does."""
    api_key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def status_hint(status: int) -> str:
    """What to do about an HTTP status the benchmark cannot fix itself ('' for the others)."""
    if status == 401:
        given = "is not the server's key" if os.environ.get("OPENAI_API_KEY") else "is not set"
        return f" (OPENAI_API_KEY {given}; export the server's --api-key as OPENAI_API_KEY)"
    return ""


def completions_payload(request: RequestInput) -> dict[str, Any]:
    return {
        "model": request.model,
        "prompt": request.prompt,
        "repetition_penalty": 1.0,
        "max_tokens": request.output_len,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def chat_payload(request: RequestInput) -> dict[str, Any]:
    if not isinstance(request.prompt, str):
        raise ValueError("the openai-chat backend sends text prompts only")
    return {
        "model": request.model,
        "messages": [{"role": "user", "content": [{"type": "text", "text": request.prompt}]}],
        "max_completion_tokens": request.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def completions_text(choice: dict[str, Any]) -> str | None:
    return choice.get("text")


def chat_text(choice: dict[str, Any]) -> str | None:
    return (choice.get("delta") or {}).get("content")


async def _stream_request(
    session: aiohttp.ClientSession,
    request: RequestInput,
    payload: dict[str, Any],
    choice_text: Callable[[dict[str, Any]], str | None],
) -> RequestOutcome:
    if request.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(request.extra_body or {})
    outcome = RequestOutcome(prompt_len=request.prompt_len)
    text_parts: list[str] = []
    start = time.perf_counter()
    outcome.start_time = start
    last_event = start
    first_event_seen = False
    try:
        async with session.post(request.api_url, json=payload, headers=auth_headers()) as response:
            if response.status != 200:
                body = (await response.read()).decode("utf-8", "replace")
                outcome.error = f"HTTP {response.status} {response.reason}{status_hint(response.status)}: {body[:500]}"
                return outcome
            parser = SSEParser()
            async for chunk in response.content.iter_any():
                now = time.perf_counter()
                for data in parser.feed(chunk):
                    if data == DONE:
                        continue
                    event = json.loads(data)
                    if choices := event.get("choices"):
                        if first_event_seen:
                            outcome.itl.append(now - last_event)
                        else:
                            first_event_seen = True
                            outcome.ttft = now - start
                        last_event = now
                        text_parts.append(choice_text(choices[0]) or "")
                    if usage := event.get("usage"):
                        outcome.output_tokens = usage.get("completion_tokens") or 0
                        if usage.get("prompt_tokens") is not None:
                            outcome.prompt_len = usage["prompt_tokens"]
                    if not choices and not usage and "error" in event:
                        # vLLM's client ignores this event; a request the server failed is counted as failed here.
                        outcome.error = f"error event: {data[:500]}"
        outcome.generated_text = "".join(text_parts)
        outcome.latency = last_event - start
        if not first_event_seen and not outcome.error:
            outcome.error = "the stream carried no choices, so there is no first token to time"
        outcome.success = not outcome.error
    except Exception:
        outcome.error = traceback.format_exc()
    return outcome


async def request_openai_completions(session: aiohttp.ClientSession, request: RequestInput) -> RequestOutcome:
    return await _stream_request(session, request, completions_payload(request), completions_text)


async def request_openai_chat(session: aiohttp.ClientSession, request: RequestInput) -> RequestOutcome:
    return await _stream_request(session, request, chat_payload(request), chat_text)


REQUEST_FUNCS: dict[str, Callable[[aiohttp.ClientSession, RequestInput], Awaitable[RequestOutcome]]] = {
    "openai": request_openai_completions,
    "openai-chat": request_openai_chat,
}
