"""The real server with `--dp 2` (two replicas of a tiny Llama behind one frontend): concurrent greedy
completions equal transformers' (what the one-replica server answers, see tests/e2e), both replicas' schedulers
did work (router and per-replica scheduler metrics, /server_info), a client hanging up mid-stream frees its
replica at once (the abort reaches the owning scheduler), and killing one replica's worker ends the
server with exit code 1, a line naming that process, and no process or socket directory left.
The tests share one server, in file order: the last one kills it."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import torch
import transformers

from tests.distributed.engine_children import assert_all_gone, engine_children
from tests.e2e.server import ServerProcess
from tests.hf_reference import hf_greedy, hf_model

# Long enough to be running on both replicas when one is killed.
LONG_TOKENS = 4000


@pytest.fixture(scope="module")
def served(tiny_checkpoint) -> Iterator[tuple[ServerProcess, Path]]:
    """The --dp 2 server and its checkpoint."""
    checkpoint = tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=LONG_TOKENS + 64)
    process = ServerProcess("--model", str(checkpoint), "--dp", "2", "--load-balance-method", "round_robin",
                            "--num-kv-blocks", str(LONG_TOKENS // 16 + 16), "--log-level", "warning")
    yield process, checkpoint
    process.stop()


def per_replica(text: str, name: str) -> dict[str, float]:
    return {match.group(1): float(match.group(2))
            for match in re.finditer(rf'^rapid_llm:{name}\{{dp_rank="(\d)",[^}}]*\}} ([0-9.e+-]+)$', text, re.M)}


def test_dp2_answers_like_transformers_on_both_replicas(served) -> None:
    server, checkpoint = served
    new_tokens = 16
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(10, 500, (7 + i,), generator=generator).tolist() for i in range(4)]

    def complete(prompt: list[int]) -> str:
        body = {"model": str(checkpoint), "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
                "min_tokens": new_tokens}
        return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(complete, prompts))
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    expected = [tokenizer.decode(ids) for ids in hf_greedy(hf_model(checkpoint), prompts, new_tokens)]
    assert texts == expected
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    assert per_replica(metrics, "dp_requests_routed_total") == {"0": 2.0, "1": 2.0}
    # Each replica's own scheduler looked up two of the prompts (in arrival order): the work really was split,
    # and the unlabelled family is the replicas' sum.
    queried = per_replica(metrics, "dp_prefix_cache_queries_total")
    pair_sums = {len(prompts[i]) + len(prompts[j]) for i in range(4) for j in range(i + 1, 4)}
    assert queried["0"] in pair_sums and queried["1"] in pair_sums
    total = re.search(r"^rapid_llm:prefix_cache_queries_total\{[^}]*\} ([0-9.]+)$", metrics, re.M)
    assert float(total.group(1)) == queried["0"] + queried["1"] == sum(len(p) for p in prompts)
    info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
    assert info["data_parallel_size"] == 2 and info["load_balance_method"] == "round_robin"
    assert [replica["requests_routed"] for replica in info["dp_replicas"]] == [2, 2]


def test_a_client_gone_mid_stream_frees_its_replica(served) -> None:
    server, _ = served
    body = {"prompt": "keep going", "max_tokens": LONG_TOKENS, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one chunk arrived: the request runs on a replica; now hang up
    metrics = server.wait_until_idle(timeout=10)
    assert metrics["rapid_llm:kv_cache_blocks_used"] == 0 and metrics["rapid_llm:num_requests_running"] == 0
    text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    assert per_replica(text, "dp_requests_in_flight") == {"0": 0.0, "1": 0.0}
    assert per_replica(text, "dp_outstanding_tokens") == {"0": 0.0, "1": 0.0}


def test_one_replica_dying_brings_the_server_down(served) -> None:
    server, _ = served
    children = engine_children(server)
    assert {f"dp{r}-{role}" for r in (0, 1) for role in ("scheduler", "detokenizer", "worker0")} <= set(
        children.values())
    victim = next(pid for pid, role in children.items() if role == "dp1-worker0")
    body = {"prompt": "keep going", "max_tokens": LONG_TOKENS, "ignore_eos": True}
    with ThreadPoolExecutor(2) as pool:
        # Round robin: the two requests land one on each replica; both end, the healthy replica's too.
        pending = [pool.submit(httpx.post, f"{server.base_url}/v1/completions", json=body, timeout=60)
                   for _ in range(2)]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        statuses = [future.result().status_code for future in pending]
    assert statuses == [503, 503]
    assert_all_gone(server, children, "dp1-worker0")
