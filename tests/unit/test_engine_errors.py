"""Engine errors reach the client: 400 for a refused request, 503 + Retry-After for a full queue, a
generic 500 for a worker failure; and /health turns 503 when a busy engine stops making progress.

The mapping is exercised in `TokenizerManager` (deltas fed to its queues, no sockets) and over HTTP
with the fake engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.tokenizer_manager import TokenizerManager
from rapid_llm.ipc.messages import GenerateRequest, SchedulerStats, TextDelta
from rapid_llm.sampling import SamplingParams
from tests.unit.fake_engine import FakeEngine

WORKER_TEXT = "ValueError: Overflow when unpacking long long"


class RecordingSender:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


class QueuedReceiver:
    """Hands out the given messages, then waits forever (like a quiet socket)."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = list(messages)

    async def recv(self) -> Any:
        if self.messages:
            return self.messages.pop(0)
        await asyncio.Event().wait()


def manager(watchdog_timeout: float = 10.0) -> TokenizerManager:
    tokenizer_manager = TokenizerManager(None, None, "tiny", "/models/tiny", 128, 512, lambda: True, True, {},
                                         watchdog_timeout=watchdog_timeout)
    tokenizer_manager._to_scheduler = RecordingSender()
    return tokenizer_manager


async def first_delta_outcome(tokenizer_manager: TokenizerManager, delta: TextDelta) -> OpenAIError:
    generator = tokenizer_manager.generate("req-7", [1, 2], SamplingParams())
    pending = asyncio.ensure_future(anext(generator))
    await asyncio.sleep(0)
    tokenizer_manager._queues["req-7"].put_nowait(delta)
    with pytest.raises(OpenAIError) as error:
        await pending
    return error.value


@pytest.mark.parametrize(
    ("kind", "text", "status"),
    [("invalid_request", "request req-7: seed must be in [...]", 400),
     ("queue_full", "request req-7: the waiting queue is full (4 requests); retry later", 503),
     ("internal", WORKER_TEXT, 500)],
)
async def test_an_error_delta_raises_the_matching_openai_error(kind: str, text: str, status: int) -> None:
    tokenizer_manager = manager()
    delta = TextDelta("req-7", "", [], finish_reason="abort", error=text, error_kind=kind)
    error = await first_delta_outcome(tokenizer_manager, delta)
    assert error.status == status
    response = error.to_response()
    assert response.status_code == status
    if kind == "invalid_request":
        assert error.message == text
    if kind == "queue_full":
        assert response.headers["retry-after"] == "1"
    if kind == "internal":
        assert "req-7" in error.message and "Overflow" not in error.message
    sent = tokenizer_manager._to_scheduler.sent
    assert [type(message) for message in sent] == [GenerateRequest], "an ended request needs no abort"


@pytest.mark.parametrize(
    ("kind", "status", "retry_after"),
    [("invalid_request", 400, None), ("queue_full", 503, "1"), ("internal", 500, None)],
)
async def test_engine_errors_over_http(tokenizer: Any, kind: str, status: int, retry_after: str | None) -> None:
    engine = FakeEngine(tokenizer)
    engine.engine_error = (kind, WORKER_TEXT)
    transport = httpx.ASGITransport(app=build_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post("/v1/completions", json={"prompt": "Hi"})
        assert response.status_code == status
        assert response.headers.get("retry-after") == retry_after
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        # A refusal arrives before any token, so a stream gets the same status instead of a 200.
        streamed = await client.post("/v1/completions", json={"prompt": "Hi", "stream": True})
        assert (streamed.status_code, streamed.headers.get("retry-after")) == (status, retry_after)
        assert streamed.json()["error"]["type"] == response.json()["error"]["type"]
        engine.engine_error = None
        assert (await client.post("/v1/completions", json={"prompt": "Hi"})).status_code == 200


async def test_health_turns_unhealthy_when_a_busy_engine_stops_reporting(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("rapid_llm.frontend.tokenizer_manager.time.monotonic", lambda: now[0])
    tokenizer_manager = manager(watchdog_timeout=10.0)
    busy = SchedulerStats(num_running=1, num_waiting=0, kv_blocks_used=1, kv_blocks_total=8, num_steps=5)
    idle = SchedulerStats(num_running=0, num_waiting=0, kv_blocks_used=0, kv_blocks_total=8, num_steps=9)

    async def deliver(*messages: SchedulerStats) -> None:
        task = asyncio.create_task(tokenizer_manager._route_scheduler_messages(QueuedReceiver(list(messages))))
        await asyncio.sleep(0)
        task.cancel()

    now[0] += 60
    assert tokenizer_manager.is_healthy(), "no stats yet: nothing is known to be stuck"
    await deliver(busy)
    now[0] += 10.5
    assert tokenizer_manager.is_healthy(), "stale stats, but no request of this frontend is waiting"
    now[0] -= 0.5
    tokenizer_manager._queues["waiting-request"] = asyncio.Queue()  # a request of ours is in flight
    assert tokenizer_manager.is_healthy()
    now[0] += 0.5
    assert not tokenizer_manager.is_healthy(), "running requests and no step for longer than the timeout"
    await deliver(idle)
    now[0] += 3600
    assert tokenizer_manager.is_healthy(), "an idle engine is healthy however long it stays idle"
