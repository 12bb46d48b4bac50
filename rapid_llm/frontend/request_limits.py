"""Limits on what a request body may be, enforced before any of it is parsed.

Key design choice: the cheap checks run as ASGI middleware on the headers, before the route reads a
byte -- a declared size over the limit is a 413, a POST body that is not JSON a 415 (so a web page
cannot drive the server with a CORS-free form or text/plain post). A body without a declared size
(chunked transfer) is counted while it is read (`read_body`) and refused as soon as it passes the
limit, so a huge body is never buffered. JSON nesting is measured on the raw bytes (`check_json_depth`)
before decoding, since a deep document would exhaust the decoder's recursion.
"""

from __future__ import annotations

import logging
import operator
import re
from itertools import accumulate, repeat

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from rapid_llm.frontend.errors import OpenAIError, bad_request

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 2**20
MAX_JSON_DEPTH = 64
_JSON_MEDIA_TYPES = (b"application/json",)
_STRING_LITERAL = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# Openers to 2 and closers to 0, so that subtracting 1 gives the depth step; all in C-level iterators.
_DEPTH_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


def body_too_large(limit: int) -> OpenAIError:
    # The rest of the body stays unread, so the connection cannot carry another request.
    return OpenAIError(413, f"the request body is larger than the server's limit of {limit} bytes "
                            "(--max-request-body-size)", code="request_too_large", headers={"connection": "close"})


class RequestLimitsMiddleware:
    """413 for a declared body size over the limit, 415 for a POST body that is not JSON."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            error = self._check(dict(scope["headers"]))
            if error is not None:
                logger.info("%s %s -> %d: %s", scope["method"], scope["path"], error.status, error.message)
                # The unread body is left behind, so the response closes the connection.
                await error.to_response(headers={"connection": "close"})(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, headers: dict[bytes, bytes]) -> OpenAIError | None:
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return body_too_large(self.max_body_bytes)
        has_body = b"transfer-encoding" in headers or (length is not None and int(length) > 0)
        media_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if has_body and media_type not in _JSON_MEDIA_TYPES:
            return OpenAIError(415, f"the request body must be JSON sent as Content-Type: application/json, "
                                    f"got {media_type.decode('latin-1') or 'none'!r}", param="Content-Type",
                               code="unsupported_media_type")
        return None


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with a 413 as soon as more than `limit` bytes have arrived."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def check_json_depth(body: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """400 when arrays/objects nest deeper than `limit`; brackets inside strings do not count."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    # Escapes first (an escaped quote does not end a string), then string contents, then all but brackets.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = _STRING_LITERAL.sub(b"", unescaped).translate(None, _NOT_BRACKETS)
    steps = map(operator.sub, brackets.translate(_DEPTH_STEP), repeat(1))
    if len(brackets) > limit and max(accumulate(steps)) > limit:
        raise bad_request(f"the request body nests JSON arrays/objects deeper than {limit} levels")
