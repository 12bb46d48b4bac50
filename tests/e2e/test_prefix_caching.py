"""Prefix caching end to end.

Golden: greedy tokens through the offline engine are identical with caching on and off, with the hash and the
radix index (and equal transformers') for prompts that share prefixes shorter than a block, of exactly N blocks
and of N blocks plus a few tokens, with chunked prefill and under preemption; the radix index's hits count to the
token (copy-on-write of the block where a prompt leaves the cached one). Server: a repeated long prompt
reports its cached tokens, /metrics counts them, and /flush_cache empties the cache.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from rapid_llm import LLM, SamplingParams
from tests.e2e.conftest import API_KEY
from tests.hf_reference import hf_greedy, hf_model

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(10, 500, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


BASE = random_tokens(48, seed=21)  # three 16-token blocks
# The first batch writes the cache: its second prompt shares all three blocks of the first, so it hits
# them in the same step (or, with chunked prefill, while the step writing the last one is in flight).
FIRST_BATCH = [BASE, BASE + random_tokens(5, seed=22)]
# The second batch reuses what the first left cached, with (cached tokens at 16 tokens per block: whole blocks with
# the hash index, to the token with the radix index):
SECOND_BATCH = [
    (BASE[:10] + random_tokens(8, seed=23), 0, 10),  # a shared prefix shorter than a block
    (BASE[:32] + random_tokens(5, seed=24), 32, 32),  # exactly two blocks, then its own tokens
    (BASE[:35] + random_tokens(6, seed=25), 32, 35),  # two blocks and three tokens: leaves block 3 inside it
    (BASE[:32], 16, 31),  # all cached: one token is computed, to have a token to sample from
    (BASE[:40], 32, 39),  # two blocks and half of the third
]
PROMPTS = FIRST_BATCH + [prompt for prompt, *_ in SECOND_BATCH]


@pytest.fixture(scope="module")
def expected(checkpoint) -> list[list[int]]:
    return hf_greedy(hf_model(checkpoint), PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize(
    ("engine_args", "counts_cached"),
    [
        pytest.param({}, True, id="caching"),
        pytest.param({"prefix_cache_policy": "hash"}, True, id="caching-hash"),
        pytest.param({"enable_prefix_caching": False}, False, id="no-caching"),
        pytest.param({"max_num_batched_tokens": 8}, True, id="caching-chunked"),
        pytest.param({"num_kv_blocks": 20, "block_size": 4, "max_model_len": 80}, False, id="caching-preemption"),
        pytest.param({"num_kv_blocks": 20, "block_size": 4, "max_model_len": 80, "prefix_cache_policy": "hash"},
                     False, id="caching-preemption-hash"),
    ],
)
def test_greedy_tokens_are_the_same_with_and_without_caching(checkpoint, expected, engine_args, counts_cached,
                                                            capfd) -> None:
    args = {"num_kv_blocks": 128, "log_level": "info", **engine_args}
    with LLM(model=str(checkpoint), **args) as llm:
        first = llm.generate(FIRST_BATCH, GREEDY)
        second = llm.generate([prompt for prompt, *_ in SECOND_BATCH], GREEDY)
    assert [o.token_ids for o in first + second] == expected
    cached = [o.num_cached_tokens for o in first + second]
    if counts_cached:
        radix = engine_args.get("prefix_cache_policy", "radix") == "radix"
        assert cached == [0, 48] + [by_radix if radix else by_hash for _, by_hash, by_radix in SECOND_BATCH]
    elif "block_size" in engine_args:
        assert "preempt" in capfd.readouterr().err.lower()
        assert any(cached), "blocks are reused even under memory pressure"
    else:
        assert not any(cached)


# ---- the server ------------------------------------------------------------------------------

LONG_PROMPT = random_tokens(1000, seed=31)
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def cached_tokens(client: openai.OpenAI, prompt: list[int]) -> int:
    response = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0)
    return response.usage.prompt_tokens_details.cached_tokens


def flush(server) -> httpx.Response:
    return httpx.post(f"{server.base_url}/flush_cache", headers=AUTH, timeout=10)


def test_a_repeated_long_prompt_is_served_from_the_cache_until_flushed(server, client: openai.OpenAI) -> None:
    server.wait_until_idle()
    assert flush(server).json() == {"flushed": True}
    before = server.metrics()
    assert cached_tokens(client, LONG_PROMPT) == 0
    assert cached_tokens(client, LONG_PROMPT) >= 960  # 62 of 63 blocks: the last one is recomputed
    metrics = server.wait_until_idle()
    # Used means referenced by a request: blocks that only cache a prefix count as free.
    assert metrics["rapid_llm:kv_cache_blocks_used"] == 0
    assert metrics["rapid_llm:prefix_cache_queries_total"] - before["rapid_llm:prefix_cache_queries_total"] == 2000
    assert metrics["rapid_llm:prefix_cache_hits_total"] - before["rapid_llm:prefix_cache_hits_total"] >= 960

    response = flush(server)
    assert (response.status_code, response.json()) == (200, {"flushed": True})
    assert cached_tokens(client, LONG_PROMPT) == 0


def test_flush_is_refused_while_a_request_runs(server, client: openai.OpenAI) -> None:
    stream = client.completions.create(model="tiny", prompt=LONG_PROMPT[:20], max_tokens=1000, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    response = flush(server)
    stream.close()
    assert response.status_code == 400
    assert "requests are running" in response.json()["error"]["message"]
    assert httpx.post(f"{server.base_url}/flush_cache", timeout=10).status_code == 401
    server.wait_until_idle()
    assert flush(server).status_code == 200
