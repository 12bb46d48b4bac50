"""While the engine starts, answer HTTP on the server's listening socket with a 503 "starting" instead of
leaving clients to a refused or hanging connection.

Key design choice: a plain thread with blocking sockets on the socket the launcher already bound, so no
ASGI app or event loop exists before the engine is ready; stopping it hands the same socket, with any
connections queued in its backlog, to uvicorn. Every answer closes its connection. `/health` gets
`{"status": "starting"}`; any other path an OpenAI-style error body with Retry-After, as a busy server's 503.
Usage: `with StartingResponder(listening_socket): engine.start_while(...)`.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
from types import TracebackType

logger = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 16384  # enough for a request line and headers; the body (if any) is never read
_READ_TIMEOUT_S = 2.0
_POLL_S = 0.1
STARTING_MESSAGE = "the server is starting: the engine is loading (a first start may compile C++ ops); retry shortly"


def starting_response(path: str) -> bytes:
    """The whole HTTP/1.1 response for a request to `path` while the engine starts."""
    if path.split("?", 1)[0] == "/health":
        body: dict[str, object] = {"status": "starting", "message": STARTING_MESSAGE}
    else:
        body = {"error": {"message": STARTING_MESSAGE, "type": "ServiceUnavailableError", "param": None,
                          "code": 503}}
    payload = json.dumps(body).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 5\r\n"
            f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n")
    return head.encode() + payload


def request_path(head: bytes) -> str:
    """The path of an HTTP request line ("/" when it cannot be read)."""
    parts = head.split(b"\r\n", 1)[0].split()
    return parts[1].decode("latin-1") if len(parts) >= 2 else "/"


class StartingResponder:
    def __init__(self, listening_socket: socket.socket | None) -> None:
        """`listening_socket`: bound and listening; None (a node that serves no HTTP) makes this a no-op."""
        self.socket = listening_socket
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="starting-responder", daemon=True)

    def __enter__(self) -> "StartingResponder":
        if self.socket is not None:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _serve(self) -> None:
        listening = self.socket
        while listening is not None and not self._stop.is_set():
            ready, _, _ = select.select([listening], [], [], _POLL_S)
            if not ready:
                continue
            try:
                connection, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                continue  # another waiter took it, or a signal arrived
            with connection:
                self._answer(connection)

    def _answer(self, connection: socket.socket) -> None:
        connection.settimeout(_READ_TIMEOUT_S)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < _MAX_HEAD_BYTES:
                data = connection.recv(4096)
                if not data:
                    return
                head += data
            connection.sendall(starting_response(request_path(head)))
        except OSError as error:  # a client that went away or stalled past the timeout
            logger.debug("starting responder: %s", error)
