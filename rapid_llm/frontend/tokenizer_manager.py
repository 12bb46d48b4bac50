"""TokenizerManager: the frontend's EngineClient over ZeroMQ.

Requests go to the scheduler; text comes back from the detokenizer and is routed to one asyncio
queue per request by a single reader task. The scheduler's own channel carries stats, kept as the
latest snapshot for /metrics, and replies to cache flushes, matched to their waiting callers by id.
Closing a request's iterator early (client gone) sends an abort, so its KV blocks are freed at once.
A request the engine ends with an error raises it as an OpenAIError. Health doubles as a watchdog:
stats change every engine step, so stats unchanged for `watchdog_timeout` while requests are
running or waiting mean the engine is stuck.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any, AsyncIterator, Callable

import zmq
import zmq.asyncio

from rapid_llm.config.scheduler_config import DEFAULT_WATCHDOG_TIMEOUT_S
from rapid_llm.frontend.errors import OpenAIError, engine_error
from rapid_llm.ipc.messages import (
    AbortRequest,
    FlushCache,
    GenerateRequest,
    SchedulerStats,
    SchedulerToFrontend,
    TextBatch,
    TextDelta,
)
from rapid_llm.ipc.sockets import AsyncReceiver, IpcPaths, Sender
from rapid_llm.sampling import SamplingParams


class TokenizerManager:
    def __init__(self, paths: IpcPaths, tokenizer: Any, model_name: str, model_path: str, max_model_len: int,
                 vocab_size: int, engine_alive: Callable[[], bool], enable_prefix_caching: bool,
                 server_info: dict[str, Any], watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT_S) -> None:
        self.paths = paths
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_path = model_path
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.enable_prefix_caching = enable_prefix_caching
        self.server_info = server_info
        self._engine_alive = engine_alive
        self._queues: dict[str, asyncio.Queue[TextDelta]] = {}
        self._stats: SchedulerStats | None = None
        self._stats_time = time.monotonic()  # when the latest stats arrived (the scheduler sends changes only)
        self.watchdog_timeout = watchdog_timeout
        self._flushes: dict[int, asyncio.Future[bool]] = {}
        self._flush_ids = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._engine_failure: OpenAIError | None = None

    async def start(self) -> None:
        """Bind the receiving sockets and start the reader tasks (inside the server's event loop)."""
        self._context = zmq.asyncio.Context()
        # A plain (synchronous) PUSH socket: sending never waits, so aborts can go out from a
        # `finally` of a cancelled request without awaiting.
        self._sync_context = zmq.Context()
        self._to_scheduler = Sender(self._sync_context, self.paths.frontend_to_scheduler)
        texts: AsyncReceiver[TextBatch] = AsyncReceiver(self._context, self.paths.detokenizer_to_frontend, TextBatch)
        scheduler: AsyncReceiver[SchedulerToFrontend] = AsyncReceiver(
            self._context, self.paths.scheduler_to_frontend, SchedulerToFrontend)
        self._tasks = [asyncio.create_task(self._route_texts(texts)),
                       asyncio.create_task(self._route_scheduler_messages(scheduler))]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._context.destroy(linger=0)
        self._sync_context.destroy(linger=0)

    async def _route_texts(self, receiver: AsyncReceiver[TextBatch]) -> None:
        while True:
            batch = await receiver.recv()
            for delta in batch.deltas:
                queue = self._queues.get(delta.request_id)
                if queue is not None:
                    queue.put_nowait(delta)

    async def _route_scheduler_messages(self, receiver: AsyncReceiver[SchedulerToFrontend]) -> None:
        while True:
            message = await receiver.recv()
            if isinstance(message, SchedulerStats):
                self._stats, self._stats_time = message, time.monotonic()
                continue
            future = self._flushes.get(message.request_id)
            if future is not None and not future.done():
                future.set_result(message.flushed)

    def fail_all(self, message: str) -> None:
        """End every waiting request and flush with a 503 saying `message`, instead of leaving them to
        wait forever: an engine process died, or the shutdown grace period is over (called on the
        event loop by the launcher)."""
        self._engine_failure = OpenAIError(503, message)
        for queue in self._queues.values():
            queue.put_nowait(self._engine_failure)
        for future in self._flushes.values():
            if not future.done():
                future.set_exception(self._engine_failure)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[TextDelta]:
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        if self._engine_failure is not None:
            raise self._engine_failure
        queue: asyncio.Queue[TextDelta | OpenAIError] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            self._to_scheduler.send(GenerateRequest(request_id, prompt_token_ids, params))
            while not finished:
                delta = await queue.get()
                if isinstance(delta, OpenAIError):
                    raise delta
                finished = delta.finish_reason is not None
                if delta.error is not None:
                    raise engine_error(request_id, delta.error_kind, delta.error)
                yield delta
        finally:
            del self._queues[request_id]
            if not finished and self._engine_failure is None:
                self._to_scheduler.send(AbortRequest(request_id))

    async def flush_cache(self) -> bool:
        request_id = next(self._flush_ids)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._flushes[request_id] = future
        try:
            self._to_scheduler.send(FlushCache(request_id))
            return await future
        finally:
            del self._flushes[request_id]

    def stats(self) -> SchedulerStats | None:
        return self._stats

    def is_healthy(self) -> bool:
        if not self._engine_alive():
            return False
        stats = self._stats
        # Without requests of its own waiting here, stale stats (a dropped snapshot) prove no stall.
        if not self._queues or stats is None or not (stats.num_running or stats.num_waiting):
            return True
        return time.monotonic() - self._stats_time <= self.watchdog_timeout
