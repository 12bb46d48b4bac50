"""SIGTERM with requests in flight: short ones finish within the grace period, the rest end with an
OpenAI error (an error event and [DONE] when streamed), and the server exits 0 leaving nothing behind."""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.server import ServerProcess, child_pids, socket_dirs, wait_gone

GRACE_S = 2.0
# Long enough to outlast the grace period however fast the tiny model decodes (~1 ms a token here).
LONG_TOKENS = 16000
LONG = {"prompt": "keep going", "max_tokens": LONG_TOKENS, "ignore_eos": True}


def test_sigterm_lets_short_requests_finish_and_ends_the_rest_with_errors(tiny_checkpoint) -> None:
    checkpoint = tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=LONG_TOKENS + 64)
    blocks = str(3 * (LONG_TOKENS + 64) // 16)  # both long requests and the short one, 16-token blocks
    server = ServerProcess("--model", str(checkpoint), "--num-kv-blocks", blocks, "--log-level", "warning",
                           "--shutdown-timeout", str(GRACE_S))
    children = child_pids(server.process.pid)
    url = f"{server.base_url}/v1/completions"
    with ThreadPoolExecutor(3) as pool:
        plain = pool.submit(httpx.post, url, json=LONG, timeout=60)
        streamed = pool.submit(httpx.post, url, json={**LONG, "stream": True}, timeout=60)
        time.sleep(1.0)
        short = pool.submit(httpx.post, url, json={"prompt": "Hi", "max_tokens": 8}, timeout=60)
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
