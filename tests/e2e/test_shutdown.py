"""SIGTERM with requests in flight: short ones finish within the grace period, the rest end with an
OpenAI error (an error event and [DONE] when streamed), and the server exits 0 leaving nothing behind."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.conftest import LONG_REQUEST, long_kv_blocks
from tests.e2e.server import ServerProcess, child_pids, socket_dirs, wait_gone

GRACE_S = 2.0


def test_sigterm_lets_short_requests_finish_and_ends_the_rest_with_errors(long_checkpoint) -> None:
    server = ServerProcess("--model", str(long_checkpoint), "--num-kv-blocks", long_kv_blocks(3), "--log-level",
                           "warning", "--shutdown-timeout", str(GRACE_S))
    children = child_pids(server.process.pid)
    url = f"{server.base_url}/v1/completions"
    with ThreadPoolExecutor(3) as pool:
        plain = pool.submit(httpx.post, url, json=LONG_REQUEST, timeout=60)
        streamed = pool.submit(httpx.post, url, json={**LONG_REQUEST, "stream": True}, timeout=60)
        time.sleep(1.0)
        short = pool.submit(httpx.post, url, json={"prompt": "Hi", "max_tokens": 8, "ignore_eos": True}, timeout=60)
        time.sleep(0.2)  # the short request has arrived before the signal
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=GRACE_S + 10) == 0
        stopped_after = time.monotonic() - started
        plain_response, stream_response, short_response = plain.result(), streamed.result(), short.result()
    server.stop()

    assert short_response.status_code == 200 and short_response.json()["usage"]["completion_tokens"] == 8
    assert plain_response.status_code == 503
    assert plain_response.json()["error"]["message"] == "the server is shutting down"
    frames = stream_response.text.split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    assert "shutting down" in json.loads(frames[-3][len("data: "):])["error"]["message"]
    assert GRACE_S - 0.5 < stopped_after < GRACE_S + 8, f"took {stopped_after:.1f} s; log:\n{server.log()}"
    assert wait_gone(children) == []
    assert socket_dirs(server.process.pid) == []
    assert "Traceback" not in server.log()
