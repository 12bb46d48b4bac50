"""The launcher's HTTP listener: a socket bound before the engine starts, and a uvicorn server around it.

Binding first turns a busy or invalid --port/--host into a one-line error in a fraction of a second,
before any weights load, and no other process can take the port while the model loads; the
socket starts listening only once uvicorn serves it. On SIGTERM uvicorn stops accepting and the
requests in flight may finish for `--shutdown-timeout` seconds; then every one still open ends with an
OpenAI error (an error event and [DONE] when streamed) instead of being cancelled mid-response. Ctrl-C
ends them at once.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
from types import FrameType
from typing import Callable

import uvicorn


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening; ValueError naming the flag otherwise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Lets a restarted server take the port while the old one's connections sit in TIME_WAIT; a socket
    # that is listening still makes bind fail.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # Listening at once reserves the port (a bound-only socket does not, with SO_REUSEADDR);
        # connections wait in the backlog until uvicorn serves the socket.
        sock.listen(socket.SOMAXCONN)
    except OSError as error:
        sock.close()
        if error.errno == errno.EADDRINUSE:
            raise ValueError(f"--port {port} is already in use on {host}; stop the process listening there or "
                             "pass another --port") from None
        raise ValueError(f"cannot listen on --host {host} --port {port} ({error.strerror or error}); pass an "
                         "address of this machine, e.g. --host 127.0.0.1 or --host 0.0.0.0") from None
    return sock


# Time the error answers need to go out after `end_streams`, before uvicorn cancels what is left.
_ANSWER_MARGIN_S = 3.0


def uvicorn_config(app: object, host: str, port: int, log_level: str, grace_s: float) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug",
                          loop="none", timeout_graceful_shutdown=grace_s + _ANSWER_MARGIN_S)


class HttpServer(uvicorn.Server):
    """uvicorn.Server that calls `end_streams` `grace_s` after a SIGTERM, or at once after Ctrl-C."""

    def __init__(self, config: uvicorn.Config, end_streams: Callable[[], None], grace_s: float) -> None:
        super().__init__(config)
        self._end_streams = end_streams
        self._grace_s = grace_s
        self._interrupted = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._interrupted = self._interrupted or sig == signal.SIGINT
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._interrupted:
            self._end_streams()
        else:
            asyncio.get_running_loop().call_later(self._grace_s, self._end_streams)
        await super().shutdown(sockets)
