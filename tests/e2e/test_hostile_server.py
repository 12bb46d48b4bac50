"""Hostile requests against the real server: huge bodies, huge prompts and runaway templates are
refused quickly, memory stays flat, and /health keeps answering fast meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from tests.e2e.server import ServerProcess

LOOPING_TEMPLATE = "{% for i in range(100000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
HEALTH_BUDGET_S = 0.1


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def raw_post(port: int, headers: str, body_chunks: Callable[[], bytes], limit_s: float) -> tuple[bytes, float]:
    """Send headers, then body chunks until the server answers; the answer's first bytes and when."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(headers.encode())
        sock.setblocking(False)
        answer = pending = b""
        while not answer.endswith(b"}") and time.monotonic() - started < limit_s:
            try:
                received = sock.recv(65536)
            except BlockingIOError:
                received = None
            except ConnectionResetError:  # the server closes on the unread rest of the body
                break
            if received is not None:
                answer += received
                if not received:
                    break
                continue
            try:
                pending = pending or body_chunks()
                pending = pending[sock.send(pending):]  # a partial send keeps the rest for later
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                time.sleep(0.001)
        return answer, time.monotonic() - started


def slowest_health_while(work: Callable[[], None], base_url: str) -> float:
    """Run `work` in a thread and poll /health meanwhile; the slowest answer in seconds."""
    thread = threading.Thread(target=work)
    thread.start()
    slowest = 0.0
    with httpx.Client(base_url=base_url, timeout=5) as http:
        while thread.is_alive():
            started = time.monotonic()
            assert http.get("/health").status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.01)
    thread.join()
    return slowest


@pytest.fixture(scope="module")
def hostile_server(checkpoint) -> ServerProcess:
    server = ServerProcess("--model", str(checkpoint), "--num-kv-blocks", "64", "--log-level", "warning",
                           "--trust-request-chat-template")
    yield server
    server.stop()


def _control(server: ServerProcess) -> dict:
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=30,
                          json={"prompt": "Hello, world", "max_tokens": 4, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["choices"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_50_mb_body_gets_413_within_a_second_and_memory_stays_flat(hostile_server: ServerProcess,
                                                                       framing: str) -> None:
    before_rss = rss_bytes(hostile_server.process.pid)
    control = _control(hostile_server)
    size = 50 * 2**20
    length = f"Content-Length: {size}" if framing == "content-length" else "Transfer-Encoding: chunked"
    headers = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{length}\r\n\r\n")
    piece = b"x" * 65536
    chunk = piece if framing == "content-length" else b"%x\r\n%s\r\n" % (len(piece), piece)
    answer, elapsed = raw_post(hostile_server.port, headers, lambda: chunk, limit_s=10)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"RequestTooLargeError"' in answer
    assert elapsed < 1.0
    assert rss_bytes(hostile_server.process.pid) - before_rss < 256 * 2**20
    assert _control(hostile_server) == control


def test_a_1_mb_prompt_beyond_the_context_is_refused_fast_while_health_answers(hostile_server: ServerProcess) -> None:
    control = _control(hostile_server)
    results: list[tuple[int, float, str]] = []

    def send() -> None:
        started = time.monotonic()
        response = httpx.post(f"{hostile_server.base_url}/v1/completions", timeout=30,
                              json={"prompt": "word " * 200_000, "max_tokens": 4})
        results.append((response.status_code, time.monotonic() - started, response.json()["error"]["code"]))

    slowest = slowest_health_while(send, hostile_server.base_url)
    [(status, elapsed, code)] = results
    assert (status, code) == (400, "context_length_exceeded")
    assert elapsed < 2.0
    assert slowest < HEALTH_BUDGET_S
    assert _control(hostile_server) == control


def test_a_looping_request_template_is_cut_off_while_health_answers(hostile_server: ServerProcess) -> None:
    control = _control(hostile_server)
    results: list[httpx.Response] = []

    def send() -> None:
        results.append(httpx.post(f"{hostile_server.base_url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "Hi"}], "chat_template": LOOPING_TEMPLATE}))

    slowest = slowest_health_while(send, hostile_server.base_url)
    [response] = results
    assert response.status_code == 400
    assert "did not finish rendering" in response.json()["error"]["message"]
    assert slowest < HEALTH_BUDGET_S
    assert _control(hostile_server) == control


@pytest.mark.parametrize(("fields", "param"), [
    ({"stop_token_ids": [18446744073709551615], "min_tokens": 2}, "stop_token_ids"),
    ({"seed": 2**70}, "seed"),
    ({"top_k": 2**70}, "top_k"),
    ({"seed": 2**64 - 1, "n": 2}, "seed"),
])
def test_numbers_that_crashed_the_worker_are_refused_by_the_real_server(hostile_server: ServerProcess,
                                                                          fields: dict, param: str) -> None:
    control = _control(hostile_server)
    response = httpx.post(f"{hostile_server.base_url}/v1/completions", timeout=30,
                          json={"prompt": "Hello, world", "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert _control(hostile_server) == control
