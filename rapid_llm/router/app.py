"""The router's HTTP app: OpenAI's generation routes in front of prefill and decode instances.

Each /v1/completions or /v1/chat/completions request goes to a prefill instance first, as one non-streamed
token with `kv_transfer_params: {"do_remote_decode": true}` (n, beams and stream options left out), and then,
unchanged apart from the `kv_transfer_params` the prefill answered with, to a decode instance, whose answer
(streamed or not) is passed through; a completions batch of prompts goes to the decode instance alone. Key design choice: a prefill instance that cannot be reached or fails (5xx)
costs only time: the decode instance then prefills the prompt itself; its own refusals (4xx) go to the client.
A client that disconnects (before the answer, or while it streams) closes the upstream request, which aborts it on
that instance. /v1/models is the first
decode instance's, /health is 200 only when every instance answers, /metrics counts requests per instance.
Usage: `app = build_app(prefill_pool, decode_pool)`, served by `python -m rapid_llm.router`.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rapid_llm.frontend.sse import CLIENT_CLOSED_REQUEST, EventStreamResponse, run_unless_disconnected
from rapid_llm.router.instances import InstancePool

logger = logging.getLogger(__name__)
# What the prefill instance must not see: it computes the prompt once and samples one token.
PREFILL_DROPPED = ("n", "best_of", "use_beam_search", "stream", "stream_options", "min_tokens", "max_completion_tokens")


def error_response(status: int, message: str, kind: str = "server_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def auth_headers(request: Request) -> dict[str, str]:
    """The client's API key, passed on to the instances (which check it, if they were started with one)."""
    return {key: value for key, value in request.headers.items() if key.lower() == "authorization"}


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    kept = {key: value for key, value in body.items() if key not in PREFILL_DROPPED}
    return {**kept, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}


class Router:
    def __init__(self, prefill: InstancePool, decode: InstancePool, client: httpx.AsyncClient) -> None:
        self.prefill = prefill
        self.decode = decode
        self.client = client

    async def generate(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as error:
            return error_response(400, f"the body is not JSON: {error}", "invalid_request_error")
        if not isinstance(body, dict):
            return error_response(400, "the body must be a JSON object", "invalid_request_error")
        answer = await run_unless_disconnected(self._route(request.url.path, body, auth_headers(request)),
                                               request.receive)
        # None: the client left first; cancelling closed the upstream request, which aborts it on that instance.
        return Response(status_code=CLIENT_CLOSED_REQUEST) if answer is None else answer

    async def _route(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        refused = kv_transfer_params = None
        # A batch of prompts (completions) is prefilled where it is decoded: an answer names one prompt's KV.
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list))):
            refused, kv_transfer_params = await self._prefill(path, body, headers)
        if refused is not None:
            return refused
        decode_body = body if kv_transfer_params is None else {**body, "kv_transfer_params": kv_transfer_params}
        return await self._decode(path, decode_body, headers)

    async def _prefill(self, path: str, body: dict[str, Any], headers: dict[str, str]
                       ) -> tuple[Response | None, dict[str, Any] | None]:
        """(a refusal for the client, or None) and the prefill's kv_transfer_params (None: decode prefills)."""
        with self.prefill.choose() as instance:
            try:
                answer = await self.client.post(instance.url + path, json=prefill_body(body), headers=headers)
            except httpx.HTTPError as error:
                instance.failures += 1
                logger.warning("prefill %s unreachable (%s): the decode instance prefills", instance.url, error)
                return None, None
        if answer.status_code >= 500:
            instance.failures += 1
            logger.warning("prefill %s answered %d: the decode instance prefills", instance.url, answer.status_code)
            return None, None
        if answer.status_code != 200:
            return Response(answer.content, answer.status_code, media_type="application/json"), None
        return None, answer.json().get("kv_transfer_params")

    async def _decode(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        with self.decode.choose() as instance:
            upstream = self.client.build_request("POST", instance.url + path, json=body, headers=headers)
            try:
                answer = await self.client.send(upstream, stream=True)
            except httpx.HTTPError as error:
                instance.failures += 1
                return error_response(502, f"decode instance {instance.url} unreachable: {error}")
            if not body.get("stream") or answer.status_code != 200:
                try:
                    content = await answer.aread()
                finally:
                    await answer.aclose()
                return Response(content, answer.status_code, media_type=answer.headers.get("content-type"))
            instance.in_flight += 1  # the stream outlives this block; `close` ends it

        async def close() -> None:
            instance.in_flight -= 1
            await answer.aclose()

        # Run even if the stream never starts (the client left at once), so the upstream request is aborted.
        return EventStreamResponse(answer.aiter_raw(), close=close)

    async def models(self, request: Request) -> Response:
        instance = self.decode.instances[0]
        try:
            answer = await self.client.get(instance.url + "/v1/models", headers=auth_headers(request))
        except httpx.HTTPError as error:
            return error_response(502, f"decode instance {instance.url} unreachable: {error}")
        return Response(answer.content, answer.status_code, media_type="application/json")

    async def health(self, request: Request) -> Response:
        down = []
        for instance in self.prefill.instances + self.decode.instances:
            try:
                ok = (await self.client.get(instance.url + "/health", timeout=5.0)).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                down.append(instance.url)
        return JSONResponse({"unhealthy": down}, 503) if down else Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        lines = []
        for name, kind, field in (("rapid_llm_router:requests_total", "counter", "requests"),
                                  ("rapid_llm_router:requests_in_flight", "gauge", "in_flight"),
                                  ("rapid_llm_router:failures_total", "counter", "failures")):
            lines += [f"# TYPE {name} {kind}"]
            lines += [f'{name}{{instance="{item.url}",role="{item.role}"}} {getattr(item, field)}'
                      for item in self.prefill.instances + self.decode.instances]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def build_app(prefill: InstancePool, decode: InstancePool, timeout_s: float = 600.0,
              transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The router's app; `transport` replaces the network (tests)."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport)
    router = Router(prefill, decode, client)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[
        Route("/v1/completions", router.generate, methods=["POST"]),
        Route("/v1/chat/completions", router.generate, methods=["POST"]),
        Route("/v1/models", router.models, methods=["GET"]),
        Route("/health", router.health, methods=["GET"]),
        Route("/metrics", router.metrics, methods=["GET"]),
    ], lifespan=lifespan)
