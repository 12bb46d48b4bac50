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


class ItemEvents:
    """The base of the `EventFormat`s whose output is a list of items (Responses' output items, Anthropic's
    content blocks): a chat chunk stream's reasoning (`reasoning_content`), text and each tool call become
    items in that order, each opened at its first delta and closed before the next opens. Subclasses build
    the items and frame the events; `finish` and `fail` are theirs."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: str | int | None = None  # "reasoning", "text", or the chat index of the open tool call
        self.call_positions: dict[int, int] = {}  # chat tool-call index -> item position
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # the stop string or token id that ended the text
        self.started = False

    def events(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self.start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                out += self.text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self.text("text", delta["content"])
            for entry in delta.get("tool_calls") or []:
                out += self._call(entry)
            if choice["finish_reason"] is not None:
                self.finish_reason, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        return out

    def start(self) -> list[bytes]:
        """The opening events, once."""
        if self.started:
            return []
        self.started = True
        return self.opening_events()

    def _open(self, item: dict[str, Any], key: str | int) -> list[bytes]:
        out = self.close_open()
        self.open = key
        self.items.append(item)
        return out + self.item_opened(len(self.items) - 1)

    def text(self, kind: str, text: str) -> list[bytes]:
        """Text of `kind` ("reasoning" or "text"), in the open item of that kind or a new one."""
        out = [] if self.open == kind else self._open(self.text_item(kind), kind)
        return out + self.text_delta(len(self.items) - 1, kind, text) if text else out

    def _call(self, entry: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        function = entry.get("function") or {}
        if "id" in entry:  # a call's opening entry (see tool_parsers/stream.py)
            out += self._open(self.call_item(entry["id"], function["name"]), entry["index"])
            self.call_positions[entry["index"]] = len(self.items) - 1
        if function.get("arguments"):
            out += self.arguments_delta(self.call_positions[entry["index"]], function["arguments"])
        return out

    def close_open(self) -> list[bytes]:
        """The closing events of the open item, if any."""
        if self.open is None:
            return []
        self.open = None
        return self.item_closed(len(self.items) - 1)

    def opening_events(self) -> list[bytes]:
        raise NotImplementedError

    def text_item(self, kind: str) -> dict[str, Any]:
        raise NotImplementedError

    def call_item(self, call_id: str, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def item_opened(self, position: int) -> list[bytes]:
        raise NotImplementedError

    def text_delta(self, position: int, kind: str, text: str) -> list[bytes]:
        raise NotImplementedError

    def arguments_delta(self, position: int, arguments: str) -> list[bytes]:
        raise NotImplementedError

    def item_closed(self, position: int) -> list[bytes]:
        raise NotImplementedError
