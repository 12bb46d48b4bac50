"""Helpers for the frontend tests: an httpx client on the ASGI app, SSE parsing, error-body checks."""

from __future__ import annotations

import json
from typing import Any

import httpx

CHAT = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}


def http_client(app: Any, **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", headers=headers)


def sse_payloads(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body, checking its framing and the closing [DONE]."""
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = response.text.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    assert all(frame.startswith("data: ") for frame in frames[:-1])
    return [json.loads(frame[len("data: "):]) for frame in frames[:-2]]


def assert_error(response: httpx.Response, status: int, param: str | None, type_: str = "BadRequestError") -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"]) == (type_, param)
    return error["message"]

