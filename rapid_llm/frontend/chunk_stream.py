"""A generated stream of chat-shaped chunk objects, and its framing as server-sent events per API.

Key design choice: `Serving.generate` yields chunk dicts and raises on failure; how the chunks and a
failure look on the wire (OpenAI's `data: [DONE]`, Responses' typed events, Anthropic's named events)
is an `EventFormat`, so the chat and completion routes and the routes translating other APIs share one
generation path. Usage: `EventStreamResponse(stream_events(stream, events), close=stream.close)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from rapid_llm.frontend.errors import OpenAIError, internal_error
from rapid_llm.frontend.sse import DONE_EVENT, sse_event

logger = logging.getLogger(__name__)


@dataclass
class ChunkStream:
    """The chunk objects of one streamed response, as generated; `close` aborts what is unfinished."""

    request_id: str
    chunks: AsyncIterator[dict[str, Any]]
    close: Callable[[], Awaitable[None]]


class EventFormat(Protocol):
    """How one API frames a chunk stream as SSE bytes."""

    def events(self, chunk: dict[str, Any]) -> list[bytes]:
        """The events one chat-shaped chunk becomes (possibly none)."""

    def finish(self) -> list[bytes]:
        """The events closing a stream that ended normally."""

    def fail(self, error: OpenAIError) -> list[bytes]:
        """The events closing a stream that failed after its 200 headers were sent."""


class OpenAIEvents:
    """OpenAI's framing: each chunk as `data: {...}`, an error as an error body, then `data: [DONE]`."""

    def events(self, chunk: dict[str, Any]) -> list[bytes]:
        return [sse_event(chunk)]

    def finish(self) -> list[bytes]:
        return [DONE_EVENT]

    def fail(self, error: OpenAIError) -> list[bytes]:
        return [sse_event(error.body()), DONE_EVENT]


def named_event(name: str, payload: object) -> bytes:
    """An SSE event with an `event:` line (the Responses and Anthropic streams name every event)."""
    return f"event: {name}\n".encode() + sse_event(payload)


async def stream_events(stream: ChunkStream, events: EventFormat) -> AsyncIterator[bytes]:
    """The SSE bytes of `stream` framed by `events`. Headers are sent already when a failure comes, so it
    can only travel as events (as vLLM does): client errors are logged as a warning, faults with their
    traceback and only the request id in the event."""
    try:
        async for chunk in stream.chunks:
            for event in events.events(chunk):
                yield event
    except OpenAIError as error:
        logger.warning("%s: %s", stream.request_id, error.message)
        failure = error
    except Exception:
        logger.exception("%s: generation failed", stream.request_id)
        failure = internal_error(stream.request_id)
    else:
        for event in events.finish():
            yield event
        return
    for event in events.fail(failure):
        yield event
