"""While the engine starts, the listening socket answers 503 "starting" (health and OpenAI shapes), and once
the responder stops, the same socket still listens, with queued connections kept, for the real server."""

from __future__ import annotations

import socket

import httpx

from rapid_llm.entrypoints.http_server import bind_listening_socket
from rapid_llm.entrypoints.starting_responder import STARTING_MESSAGE, StartingResponder


def test_health_and_routes_answer_starting_until_stopped() -> None:
    listening = bind_listening_socket("127.0.0.1", 0)
    port = listening.getsockname()[1]
    try:
        with StartingResponder(listening):
            health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            assert health.status_code == 503
            assert health.json() == {"status": "starting", "message": STARTING_MESSAGE}
            models = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "x"}, timeout=5)
            assert models.status_code == 503 and models.headers["retry-after"] == "5"
            assert models.json()["error"]["message"] == STARTING_MESSAGE
            # A client that connects and says nothing does not stop the others from being answered.
            with socket.create_connection(("127.0.0.1", port)):
                assert httpx.get(f"http://127.0.0.1:{port}/health?x=1", timeout=5).status_code == 503
        # Stopped: a new connection waits in the backlog for whoever serves the socket next.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            listening.settimeout(5)
            accepted, _ = listening.accept()
            with accepted:
                assert accepted.recv(1024).startswith(b"GET /health")
    finally:
        listening.close()


def test_no_socket_is_a_no_op() -> None:
    with StartingResponder(None) as responder:
        assert not responder._thread.is_alive()
