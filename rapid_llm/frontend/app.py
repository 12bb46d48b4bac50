"""The Starlette app: OpenAI routes (and Anthropic's /v1/messages, vLLM's LoRA load/unload) plus /health,
/version, /metrics, /server_info, /flush_cache, /tokenize and /detokenize.

Key design choice: every failure leaves as an error body of the route's API (OpenAI's, Anthropic's on
/v1/messages) -- client mistakes are logged as one INFO line (no traceback), server faults with their
traceback in the log and only a request id in the body -- and the API key, when set (as a Bearer token
or x-api-key), guards /v1/*, the state-changing /flush_cache, /server_info (it shows paths) and the
tokenizer routes, so that probes and Prometheus scrapes need no secret.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from typing import Awaitable, Callable, Sequence

from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

import rapid_llm
from rapid_llm.frontend.engine_client import EngineClient
from rapid_llm.frontend.errors import OpenAIError, bad_request, internal_error
from rapid_llm.frontend.lora_adapters import LoRAAdapters
from rapid_llm.frontend.messages_protocol import anthropic_error_response
from rapid_llm.frontend.metrics import CONTENT_TYPE, FrontendMetrics
from rapid_llm.frontend.serving_chat import create_chat_completion
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.request_limits import RequestLimitsMiddleware
from rapid_llm.frontend.serving_common import Serving, json_response
from rapid_llm.frontend.serving_completions import create_completion
from rapid_llm.frontend.serving_embeddings import create_embedding
from rapid_llm.frontend.serving_lora import load_lora_adapter, unload_lora_adapter
from rapid_llm.frontend.serving_messages import create_message
from rapid_llm.frontend.serving_responses import ResponsesRoute
from rapid_llm.frontend.serving_tokenize import detokenize, tokenize

logger = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]
_GUARDED_PATHS = ("/v1", "/flush_cache", "/server_info", "/tokenize", "/detokenize")


ErrorRenderer = Callable[[OpenAIError], Response]


def _client_error(request: Request, error: OpenAIError, render: ErrorRenderer = OpenAIError.to_response) -> Response:
    logger.info("%s %s -> %d: %s", request.method, request.url.path, error.status, error.message)
    return render(error)


def _guarded(handler: Callable[[Serving, Request], Awaitable[Response]], serving: Serving,
             render: ErrorRenderer = OpenAIError.to_response) -> Endpoint:
    """The route, answering OpenAIError and unexpected exceptions with error bodies `render` shapes
    (OpenAI's unless the route speaks another API)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(serving, request)
        except OpenAIError as error:
            return _client_error(request, error, render)
        except Exception:
            error_id = uuid.uuid4().hex
            logger.exception("%s %s failed (request id %s)", request.method, request.url.path, error_id)
            return render(internal_error(error_id))

    return endpoint


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    """Router errors (unknown route, wrong method) in the OpenAI shape."""
    return _client_error(request, OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))


class _ApiKeyMiddleware:
    """Rejects guarded requests with a 401 unless they carry the key as `Authorization: Bearer <api_key>`
    (scheme in any case) or as `x-api-key: <api_key>` (how Anthropic clients send it); /v1/messages
    answers in Anthropic's error shape."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = api_key.encode()

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        authorization = next((value for name, value in headers if name == b"authorization"), b"")
        scheme, _, token = authorization.strip().partition(b" ")
        x_api_key = next((value for name, value in headers if name == b"x-api-key"), None)
        bearer_ok = scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self.expected)
        return bearer_ok or (x_api_key is not None and secrets.compare_digest(x_api_key.strip(), self.expected))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_GUARDED_PATHS) and scope["method"] != "OPTIONS":
            if not self._authorized(scope["headers"]):
                error = OpenAIError(401, "Invalid or missing API key.", code="invalid_api_key")
                logger.info("%s %s -> 401: %s", scope["method"], scope["path"], error.message)
                render = anthropic_error_response if scope["path"] == "/v1/messages" else OpenAIError.to_response
                await render(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def flush_cache(serving: Serving, request: Request) -> Response:
    """POST /flush_cache: empty the prefix cache (SGLang's route); refused while requests run."""
    serving.check_engine()
    if not await serving.engine.flush_cache():
        raise bad_request("cannot flush the prefix cache while requests are running; retry when idle")
    return json_response({"flushed": True})


def build_app(engine: EngineClient, options: FrontendOptions = FrontendOptions(),
              collectors: Sequence[Collector] = (), adapters: LoRAAdapters | None = None) -> Starlette:
    """The HTTP app serving `engine` with the limits, API key and chat-template policy of `options`;
    `collectors` add families to /metrics (the data-parallel replicas'); `adapters`: the LoRA adapters clients
    may name (None: the base model only)."""
    serving = Serving(engine, FrontendMetrics(engine.model_name), options, adapters)
    for collector in collectors:
        serving.metrics.registry.register(collector)
    created = int(time.time())

    async def models(request: Request) -> Response:
        model = {
            "id": engine.model_name,
            "object": "model",
            "created": created,
            "owned_by": "rapid_llm",
            "root": engine.model_path,
            "max_model_len": engine.max_model_len,
        }
        return json_response({"object": "list", "data": [model, *serving.adapters.model_cards()]})

    async def health(request: Request) -> Response:
        if engine.is_healthy():
            return Response(status_code=200)
        return OpenAIError(503, "the engine is not serving: a process died or it has made no progress "
                               "for --watchdog-timeout seconds; see the server log").to_response()

    async def version(request: Request) -> Response:
        return json_response({"version": rapid_llm.__version__})

    async def server_info(request: Request) -> Response:
        return json_response(engine.server_info)

    async def metrics(request: Request) -> Response:
        return Response(serving.metrics.render(engine.stats()), media_type=CONTENT_TYPE)

    responses = ResponsesRoute()
    routes = [
        Route("/v1/completions", _guarded(create_completion, serving), methods=["POST"]),
        Route("/v1/chat/completions", _guarded(create_chat_completion, serving), methods=["POST"]),
        Route("/v1/responses", _guarded(responses.create, serving), methods=["POST"]),
        Route("/v1/responses/{response_id}", _guarded(responses.retrieve, serving), methods=["GET"]),
        Route("/v1/responses/{response_id}", _guarded(responses.delete, serving), methods=["DELETE"]),
        Route("/v1/messages", _guarded(create_message, serving, anthropic_error_response), methods=["POST"]),
        Route("/v1/embeddings", _guarded(create_embedding, serving), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/load_lora_adapter", _guarded(load_lora_adapter, serving), methods=["POST"]),
        Route("/v1/unload_lora_adapter", _guarded(unload_lora_adapter, serving), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/flush_cache", _guarded(flush_cache, serving), methods=["POST"]),
        Route("/tokenize", _guarded(tokenize, serving), methods=["POST"]),
        Route("/detokenize", _guarded(detokenize, serving), methods=["POST"]),
    ]
    middleware = [Middleware(_ApiKeyMiddleware, api_key=options.api_key)] if options.api_key else []
    middleware.append(Middleware(RequestLimitsMiddleware, max_body_bytes=options.max_request_body_bytes))
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_exception})
