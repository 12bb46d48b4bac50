"""OpenAI-style errors: one exception type the routes raise, one JSON body shape clients parse.

Every failure the frontend reports -- bad JSON, a field out of range, an unknown model or route,
a missing API key -- becomes `{"error": {"message", "type", "param", "code"}}` with the HTTP
status, so the OpenAI SDK raises its matching exception class and the server keeps serving.
"""

from __future__ import annotations

from http import HTTPStatus

import msgspec
from starlette.responses import Response

from rapid_llm.ipc.messages import ErrorKind

# The `type` names vLLM's server uses; the OpenAI SDK keys its exception classes on the status.
_ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.UNAUTHORIZED: "AuthenticationError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.METHOD_NOT_ALLOWED: "MethodNotAllowedError",
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: "RequestTooLargeError",
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: "UnsupportedMediaTypeError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    """A request the server answers with an OpenAI error body instead of a result."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _ERROR_TYPES.get(HTTPStatus(status), HTTPStatus(status).phrase.replace(" ", ""))
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_response(self, headers: dict[str, str] | None = None) -> Response:
        """The error as an HTTP response; `headers` add to the error's own (e.g. Retry-After)."""
        return Response(msgspec.json.encode(self.body()), status_code=self.status,
                        headers={**(self.headers or {}), **(headers or {})}, media_type="application/json")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(HTTPStatus.BAD_REQUEST, message, param=param, code=code)


def engine_error(request_id: str, kind: ErrorKind | None, message: str) -> OpenAIError:
    """The client's view of a request the engine ended with an error (TextDelta.error)."""
    if kind == "invalid_request":
        return bad_request(message)
    if kind == "queue_full":
        return OpenAIError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is overloaded: too many requests are "
                           "waiting; retry later", headers={"Retry-After": "1"})
    # The engine's own text may show internals; the server log has it, under this id.
    return internal_error(request_id)


def internal_error(request_id: str) -> OpenAIError:
    """A 500 whose body names only the request id: the exception text stays in the server log."""
    return OpenAIError(HTTPStatus.INTERNAL_SERVER_ERROR,
                       f"internal server error (request id {request_id}); see the server log")
