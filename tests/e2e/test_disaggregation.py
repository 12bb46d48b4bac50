"""Prefill/decode disaggregation end to end: real prefill and decode instances (`--kv-transfer-config`) behind
`python -m rapid_llm.router`, against the decode instance serving the same requests colocated.

Golden, per model family (fp32 tiny Llama, Qwen3-MoE and DeepSeek-V3 with its MLA latent cache): greedy tokens,
streamed text, seeded n > 1 choices, JSON-schema output and a prompt whose first blocks the decode instance has
cached are identical through the router, and the decode instance reports the transferred blocks as cached tokens;
2P1D and 1P2D (each family); a single-rank prefill instance feeding a two-rank decode instance (each rank loads its share of the
KV heads, or the whole MLA latent). Faults (Llama): a prefill instance killed with SIGKILL after it answered and a
load from an address nobody serves (aborted by its client while loading) end in a local prefill or an abort; an
unreachable prefill instance makes the router let the decode instance prefill; a client that leaves the router
(before the answer, or while it streams) aborts its request on the decode instance. After every case both
instances report 0 KV blocks in use and 0 running requests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import pytest

from rapid_llm.worker_proc.kv_mooncake import mooncake_missing
from tests.e2e.server import ServerProcess, free_port

FAMILIES = ["LlamaForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"]
MODEL = "tiny"
PROMPT = list(range(10, 110))  # 100 tokens: six full 16-token blocks are transferred
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


class RouterProcess:
    """`python -m rapid_llm.router` on a free port, waited on until it answers (/health: only while every instance
    does)."""

    def __init__(self, prefill: list[str], decode: list[str], policy: str = "least_load") -> None:
        self.base_url = f"http://127.0.0.1:{(port := free_port())}"
        self.process = subprocess.Popen([sys.executable, "-m", "rapid_llm.router", "--prefill", *prefill,
                                         "--decode", *decode, "--port", str(port), "--policy", policy,
                                         "--log-level", "warning"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/metrics", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("the router did not become healthy")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def instance(checkpoint, role: str, *extra: str, lease_ttl_s: float = 120, load_timeout_s: float = 5,
             kv_ip: str = "127.0.0.1", connector: str = "ZmqConnector", **server: object) -> ServerProcess:
    """A prefill (kv_producer) or decode (kv_consumer) instance; `server`: ServerProcess's options."""
    config = {"kv_connector": connector, "kv_role": role, "kv_port": free_port(), "kv_ip": kv_ip,
              "kv_connector_extra_config": {"load_timeout_s": load_timeout_s, "lease_ttl_s": lease_ttl_s}}
    return ServerProcess("--model", str(checkpoint), "--served-model-name", MODEL, "--num-kv-blocks", "128",
                         "--kv-transfer-config", json.dumps(config), "--log-level", "warning", *extra, **server)


@pytest.fixture(scope="module", params=FAMILIES)
def deployment(request, tiny_checkpoint) -> Iterator[tuple[ServerProcess, ServerProcess, RouterProcess]]:
    checkpoint = tiny_checkpoint(request.param, max_position_embeddings=512)
    prefill, decode = instance(checkpoint, "kv_producer"), instance(checkpoint, "kv_consumer")
    router = RouterProcess([prefill.base_url], [decode.base_url])
    yield prefill, decode, router
    router.stop()
    prefill.stop()
    decode.stop()


def completion(base_url: str, **body: object) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, **body}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=120).raise_for_status().json()


def flush(server: ServerProcess) -> None:
    httpx.post(f"{server.base_url}/flush_cache", timeout=10).raise_for_status()


def colocated_choices(decode: ServerProcess, **body: object) -> list[str]:
    """The decode instance's own answer (no transfer) from a flushed cache, which it leaves flushed."""
    flush(decode)
    texts = [choice["text"] for choice in completion(decode.base_url, **body)["choices"]]
    assert_idle(decode)
    flush(decode)
    return texts


def assert_idle(*servers: ServerProcess) -> None:
    for server in servers:
        metrics = server.wait_until_idle(timeout=10)
        assert (metrics["rapid_llm:kv_cache_blocks_used"], metrics["rapid_llm:num_requests_running"]) == (0, 0)


@pytest.mark.parametrize("case", ["greedy", "n3", "json_schema"])
def test_through_the_router_the_output_is_the_colocated_one(deployment, case: str) -> None:
    prefill, decode, router = deployment
    body = {"greedy": {}, "n3": {"n": 3, "temperature": 0.9, "seed": 7},
            "json_schema": {"response_format": {"type": "json_schema",
                                                "json_schema": {"name": "a", "schema": SCHEMA}}}}[case]
    colocated = colocated_choices(decode, **body)
    before = decode.metrics()
    routed = completion(router.base_url, **body)
    assert [choice["text"] for choice in routed["choices"]] == colocated
    assert routed["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # the transferred blocks
    after = decode.metrics()
    loads, moved = "rapid_llm:kv_transfer_loads_total", "rapid_llm:kv_transfer_bytes_total"
    assert after[loads] - before[loads] == 1  # one for all n choices
    assert after[moved] > before[moved]
    assert_idle(prefill, decode)


def test_a_streamed_answer_is_the_colocated_one(deployment) -> None:
    prefill, decode, router = deployment
    (colocated,) = colocated_choices(decode)
    text = ""
    with httpx.stream("POST", f"{router.base_url}/v1/completions", timeout=120, json={
            "model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                text += "".join(choice["text"] for choice in json.loads(line[6:])["choices"])
    assert text == colocated
    assert_idle(prefill, decode)


def test_blocks_the_decode_instance_has_cached_are_kept(deployment) -> None:
    prefill, decode, router = deployment
    (colocated,) = colocated_choices(decode)
    completion(decode.base_url, prompt=PROMPT[:40], max_tokens=1)  # caches two blocks there
    routed = completion(router.base_url)
    assert routed["choices"][0]["text"] == colocated
    assert routed["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    assert_idle(prefill, decode)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_leaves_aborts_its_request_where_it_runs(deployment, stream: bool) -> None:
    prefill, decode, router = deployment
    before = aborted(prefill) + aborted(decode)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "n": 4, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{router.base_url}/v1/completions", timeout=30, json=body) as answer:
            next(answer.iter_bytes())  # the first chunk, then the connection is closed unread
    else:
        # The client gives up while the prefill or (more likely) the decode instance works on its request.
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{router.base_url}/v1/completions", timeout=0.2, json=body)
    deadline = time.monotonic() + 10
    while aborted(prefill) + aborted(decode) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert aborted(prefill) + aborted(decode) > before
    assert_idle(prefill, decode)


def aborted(server: ServerProcess) -> float:
    """Choices the instance ended with finish reason abort, since start."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    lines = [line for line in text.splitlines() if line.startswith("rapid_llm:request_success_total")
             and 'finished_reason="abort"' in line]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@pytest.fixture(scope="module")
def llama(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=512)


def test_a_prefill_instance_killed_after_answering_costs_a_local_prefill(llama) -> None:
    prefill = instance(llama, "kv_producer", new_session=True)
    decode = instance(llama, "kv_consumer")
    try:
        colocated = completion(decode.base_url)["choices"][0]["text"]
        flush(decode)
        params = completion(prefill.base_url, max_tokens=1,
                            kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
        os.killpg(prefill.process.pid, signal.SIGKILL)
        prefill.process.wait(10)
        started = time.monotonic()
        answer = completion(decode.base_url, kv_transfer_params=params)
        assert answer["choices"][0]["text"] == colocated
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert time.monotonic() - started < 30
        assert decode.metrics()["rapid_llm:kv_transfer_failures_total"] == 1
        assert_idle(decode)
    finally:
        prefill.stop()
        decode.stop()


def test_an_abort_while_loading_and_an_unreachable_prefill_leave_nothing_behind(llama) -> None:
    prefill = instance(llama, "kv_producer", lease_ttl_s=3)
    decode = instance(llama, "kv_consumer")
    dead = f"http://127.0.0.1:{free_port()}"
    router = RouterProcess([dead], [decode.base_url])
    try:
        colocated = completion(decode.base_url)["choices"][0]["text"]
        assert completion(router.base_url)["choices"][0]["text"] == colocated
        assert httpx.get(f"{router.base_url}/health").json() == {"unhealthy": [dead]}
        assert f'failures_total{{instance="{dead}",role="prefill"}} 1' in httpx.get(f"{router.base_url}/metrics").text
        # A real lease, named at an address nobody serves: the load waits until its deadline; the lease expires.
        params = completion(prefill.base_url, max_tokens=1,
                            kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
        nobody = {**params, "remote_port": free_port()}
        flush(decode)
        with pytest.raises(httpx.TimeoutException):  # the client gives up while the load waits for an answer
            httpx.post(f"{decode.base_url}/v1/completions", timeout=1.0, json={
                "model": MODEL, "prompt": PROMPT, "max_tokens": 4, "kv_transfer_params": nobody})
        assert_idle(prefill, decode)
    finally:
        router.stop()
        prefill.stop()
        decode.stop()


@pytest.mark.parametrize("family", FAMILIES)
def test_two_prefills_feed_one_decode_and_one_prefill_feeds_two_decodes(tiny_checkpoint, family: str) -> None:
    checkpoint = tiny_checkpoint(family, max_position_embeddings=512)
    prefills = [instance(checkpoint, "kv_producer") for _ in range(2)]
    decodes = [instance(checkpoint, "kv_consumer") for _ in range(2)]
    routers = {"2P1D": RouterProcess([p.base_url for p in prefills], [decodes[0].base_url], "round_robin"),
               "1P2D": RouterProcess([prefills[0].base_url], [d.base_url for d in decodes], "round_robin")}
    prompts = [[token + shift for token in PROMPT] for shift in range(4)]
    try:
        colocated = [completion(decodes[0].base_url, prompt=prompt)["choices"][0]["text"] for prompt in prompts]
        for router in routers.values():
            for server in decodes:
                flush(server)
            with ThreadPoolExecutor(len(prompts)) as pool:
                routed = list(pool.map(lambda prompt: completion(router.base_url, prompt=prompt), prompts))
            assert [answer["choices"][0]["text"] for answer in routed] == colocated
            assert all(answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 96 for answer in routed)
        for name, router, instances in (("2P1D", routers["2P1D"], prefills), ("1P2D", routers["1P2D"], decodes)):
            counts = httpx.get(f"{router.base_url}/metrics").text
            role = "prefill" if name == "2P1D" else "decode"
            for server in instances:  # round robin over the pool of two
                assert f'requests_total{{instance="{server.base_url}",role="{role}"}} 2' in counts, name
        assert_idle(*prefills, *decodes)
    finally:
        for router in routers.values():
            router.stop()
        for server in prefills + decodes:
            server.stop()


@pytest.mark.parametrize("family", ["LlamaForCausalLM", "DeepseekV3ForCausalLM"])
def test_a_single_rank_prefill_feeds_a_two_rank_decode(tiny_checkpoint, family: str) -> None:
    checkpoint = tiny_checkpoint(family, max_position_embeddings=512)
    prefill = instance(checkpoint, "kv_producer")
    decode = instance(checkpoint, "kv_consumer", "--tensor-parallel-size", "2")
    router = RouterProcess([prefill.base_url], [decode.base_url])
    try:
        (colocated,) = colocated_choices(decode)
        routed = completion(router.base_url)
        assert routed["choices"][0]["text"] == colocated
        assert routed["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert decode.metrics()["rapid_llm:kv_transfer_loads_total"] == 1
        assert_idle(prefill, decode)
    finally:
        router.stop()
        prefill.stop()
        decode.stop()


@pytest.mark.skipif(mooncake_missing() is not None, reason=str(mooncake_missing()))
@pytest.mark.parametrize("family", FAMILIES)
def test_the_mooncake_connector_gives_the_colocated_output(tiny_checkpoint, family: str) -> None:
    checkpoint = tiny_checkpoint(family, max_position_embeddings=512)
    prefill = instance(checkpoint, "kv_producer", connector="MooncakeConnector")
    decode = instance(checkpoint, "kv_consumer", connector="MooncakeConnector")
    router = RouterProcess([prefill.base_url], [decode.base_url])
    try:
        for body in ({}, {"n": 3, "temperature": 0.9, "seed": 7}):
            colocated = colocated_choices(decode, **body)
            routed = completion(router.base_url, **body)
            assert [choice["text"] for choice in routed["choices"]] == colocated
            assert routed["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert decode.metrics()["rapid_llm:kv_transfer_loads_total"] == 2
        assert_idle(prefill, decode)
    finally:
        router.stop()
        prefill.stop()
        decode.stop()
