"""Server-sent events and client-disconnect handling for the generation routes.

Key design choice: both the streaming response and the non-streaming wait race the work against
the ASGI `http.disconnect` message and cancel the work when the client goes away. Cancelling
unwinds the generator chain down to the engine iterators, whose closing aborts the requests -- so
an abandoned request stops using the engine even while it produces no output to fail a send on.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable, TypeVar

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

DONE_EVENT = b"data: [DONE]\n\n"
# Status of the response nobody reads once a non-streaming client has gone (nginx's convention).
CLIENT_CLOSED_REQUEST = 499

T = TypeVar("T")


def sse_event(payload: object) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone; call only after the request body has been read."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_unless_disconnected(work: Awaitable[T], receive: Receive) -> T | None:
    """The result of `work`, or None (work cancelled) when the client disconnected first."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((work_task, watch_task), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Also reached when this coroutine itself is cancelled (server shutdown).
        for task in (work_task, watch_task):
            task.cancel()
        await asyncio.gather(work_task, watch_task, return_exceptions=True)
    return None if work_task.cancelled() else work_task.result()


class EventStreamResponse(Response):
    """Streams pre-framed SSE bytes; stops and closes the source as soon as the client leaves."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], close: Callable[[], Awaitable[None]] | None = None) -> None:
        """`close` runs when the response ends, even if `events` never started (client gone at once)."""
        self.events = events
        self.close = close
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "content-type": "text/event-stream; charset=utf-8"})

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for event in self.events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await run_unless_disconnected(self._send_all(send), receive)
        except OSError:
            pass  # the transport noticed the disconnect first; the finally below still cleans up
        finally:
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.close is not None:
                await self.close()
