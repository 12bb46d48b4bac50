"""The real server through the real openai client: completions, chat, streaming, usage, stops,
seeds, n, logprobs, concurrency and aborts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from rapid_llm.ops.registry import REGISTRY

from tests.e2e.conftest import API_KEY, SERVER_MAX_MODEL_LEN
from tests.hf_reference import TOKENIZER_IMPORTS_TORCH, TOKENIZER_IMPORTS_TORCH_REASON

PROMPT = "The server reads a request and"


def test_completion_usage_counts_are_exact(client: openai.OpenAI, checkpoint) -> None:
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert response.usage.completion_tokens == 12
    assert response.usage.total_tokens == response.usage.prompt_tokens + 12


def test_streamed_completion_equals_non_streamed(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == full.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streams_role_first_and_matches(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
    kwargs = dict(model="tiny", messages=messages, max_tokens=16, temperature=0)
    full = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert full.choices[0].message.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_stop_string_ends_the_text_before_it(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**kwargs).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assume = text.index(stop)
    response = client.completions.create(stop=[stop], **kwargs)
    assert response.choices[0].text == text[:assume]
    assert response.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **kwargs)
                       if c.choices)
    assert streamed == text[:assume]


def test_seed_reproduces_and_n_gives_distinct_choices(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=16, temperature=1.0, extra_body={"ignore_eos": True})
    first = client.completions.create(seed=7, **kwargs).choices[0].text
    assert client.completions.create(seed=7, **kwargs).choices[0].text == first
    assert client.completions.create(seed=8, **kwargs).choices[0].text != first
    several = client.completions.create(n=3, seed=7, **kwargs)
    assert sorted(c.index for c in several.choices) == [0, 1, 2]
    assert len({c.text for c in several.choices}) == 3
    assert several.usage.completion_tokens == 48


def test_a_batch_of_prompts(client: openai.OpenAI) -> None:
    kwargs = dict(model="tiny", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    batch = client.completions.create(prompt=[PROMPT, "Another prompt"], **kwargs)
    alone = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in (PROMPT, "Another prompt")]
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == alone
    assert batch.usage.completion_tokens == 12


def test_logprobs(client: openai.OpenAI) -> None:
    response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 5
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)
    # Greedy picks the most likely token, so its logprob is the best of the top ones.
    assert all(value >= max(top.values()) - 1e-4 for value, top in zip(logprobs.token_logprobs,
                                                                        logprobs.top_logprobs))
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(entry.top_logprobs) == 3 for entry in content)


def test_32_concurrent_requests_of_mixed_lengths(async_client: openai.AsyncOpenAI, client: openai.OpenAI) -> None:
    words = "the server reads a request turns the prompt into tokens and schedules it".split()
    prompts = [" ".join(words[: 1 + i % len(words)]) * (1 + i % 4) for i in range(32)]

    async def run_all() -> list[str]:
        responses = await asyncio.gather(*(
            async_client.completions.create(model="tiny", prompt=p, max_tokens=8 + i % 9, temperature=0,
                                            extra_body={"ignore_eos": True})
            for i, p in enumerate(prompts)))
        return [r.choices[0].text for r in responses]

    concurrent = asyncio.run(run_all())
    for i in (0, 7, 31):
        alone = client.completions.create(model="tiny", prompt=prompts[i], max_tokens=8 + i % 9, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert alone.choices[0].text == concurrent[i]


def test_abort_mid_stream_frees_every_block(server, client: openai.OpenAI) -> None:
    stream = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=400, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    metrics = server.wait_until_idle()
    assert metrics["rapid_llm:kv_cache_blocks_used"] == 0
    assert metrics["rapid_llm:kv_cache_blocks_total"] == 256
    assert metrics["rapid_llm:num_requests_running"] == 0


def test_engine_timings_reach_the_request_histograms(server, client: openai.OpenAI) -> None:
    before = server.metrics()
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, temperature=0,
                              extra_body={"ignore_eos": True})
    after = server.metrics()
    for name in ("queue_time", "prefill_time", "decode_time", "inference_time", "time_per_output_token"):
        key = f"rapid_llm:request_{name}_seconds"
        assert after[key + "_count"] - before[key + "_count"] == 1, name
    # The scheduler's prefill time is part of the inference time the frontend adds its decode time to.
    prefill = after["rapid_llm:request_prefill_time_seconds_sum"] - before["rapid_llm:request_prefill_time_seconds_sum"]
    inference = (after["rapid_llm:request_inference_time_seconds_sum"]
                 - before["rapid_llm:request_inference_time_seconds_sum"])
    assert 0 < prefill < inference
    assert after["rapid_llm:request_generation_tokens_sum"] - before["rapid_llm:request_generation_tokens_sum"] == 6


def test_models_health_version(server) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    models = httpx.get(f"{server.base_url}/v1/models", headers=headers).json()
    entry = models["data"][0]
    assert entry["id"] == "tiny" and entry["object"] == "model" and entry["max_model_len"] == SERVER_MAX_MODEL_LEN
    assert {"created", "owned_by", "root"} <= set(entry)
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/version").json()["version"]
    info = httpx.get(f"{server.base_url}/server_info", headers=headers).json()
    assert info["num_kv_blocks"] == 256 and info["served_model_name"] == "tiny"
    assert info["kv_cache_tokens"] == 256 * info["block_size"] and info["kv_cache_bytes"] > 0
    assert info["dtype"] == "float32" and info["device"] in ("cpu", "cuda")
    assert info["max_model_len"] == SERVER_MAX_MODEL_LEN and info["async_scheduling"] is True
    # The server is this machine's CPU process in fp32: its choice is what this process's registry selects.
    expected = REGISTRY.select("attention", "cpu", "float32").backend
    assert info["ops"]["attention"]["backend"] == expected and info["ops"]["rms_norm"]["reason"]
    assert info["device"] == "cuda" or info["cpu_threads"] >= 1


@pytest.mark.skipif(TOKENIZER_IMPORTS_TORCH, reason=TOKENIZER_IMPORTS_TORCH_REASON)
def test_the_http_process_never_loads_torch(server) -> None:
    """Only the worker needs torch; the launcher (uvicorn + tokenizer) keeps its memory small."""
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "libtorch" not in maps


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"model": "tiny", "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
        ({"model": "other", "prompt": "hi"}, 404, "model"),
        ({"model": "tiny", "prompt": "hi", "max_tokens": 100000}, 400, None),
    ],
)
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(server, client, body, status, param) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers)
    assert response.status_code == status
    error = response.json()["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    if param is not None:
        assert error["param"] == param
    if body.get("max_tokens") == 100000:
        assert str(SERVER_MAX_MODEL_LEN) in error["message"] and "100000" in error["message"]
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices[0].text is not None


def test_malformed_json_and_api_key(server) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    response = httpx.post(f"{server.base_url}/v1/completions", content=b"{not json", headers=headers)
    assert response.status_code == 400 and "error" in response.json()
    assert httpx.post(f"{server.base_url}/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, headers=wrong).status_code == 401
