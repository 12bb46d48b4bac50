"""Prompt logprobs over HTTP (`echo` + `logprobs`, `max_tokens: 0`, vLLM's `prompt_logprobs`) against
transformers' log-softmax of the same prompt in float32, with chunked prefill off and forced on, and
with the prompt's blocks already in the prefix cache (prompt-logprob requests skip the cache)."""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest
import torch
import transformers

from tests.e2e.server import ServerProcess

TOLERANCE = 1e-3
PROMPT_IDS = [1, *range(40, 140)]  # 101 tokens: several 16-token blocks and, at a 32-token budget, 4 chunks


@pytest.fixture(scope="module")
def reference(server_checkpoint) -> torch.Tensor:
    """[len(PROMPT_IDS), vocab] float32 log-softmax of transformers' logits."""
    model = transformers.AutoModelForCausalLM.from_pretrained(server_checkpoint, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([PROMPT_IDS])).logits[0].float().log_softmax(dim=-1)


@pytest.fixture(scope="module", params=["one chunk", "chunked"])
def server(request, server_checkpoint) -> Iterator[ServerProcess]:
    budget = ["--max-num-batched-tokens", "32"] if request.param == "chunked" else []
    process = ServerProcess("--model", str(server_checkpoint), "--dtype", "float32", "--num-kv-blocks", "256",
                            "--log-level", "warning", *budget)
    yield process
    process.stop()


def complete(server: ServerProcess, **body: object) -> dict:
    response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": PROMPT_IDS, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def expected_logprobs(reference: torch.Tensor) -> list[float]:
    return [reference[j, PROMPT_IDS[j + 1]].item() for j in range(len(PROMPT_IDS) - 1)]


def test_echo_with_max_tokens_0_scores_the_prompt_like_transformers(server, reference) -> None:
    answer = complete(server, max_tokens=0, echo=True, logprobs=2, temperature=0)
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert len(logprobs["tokens"]) == len(PROMPT_IDS)  # the prompt only: the token sampled to end it is dropped
    got = torch.tensor(logprobs["token_logprobs"][1:])
    assert torch.allclose(got, torch.tensor(expected_logprobs(reference)), atol=TOLERANCE)
    # Each top_logprobs dict holds the prompt token plus the 2 most likely under the reference (keyed by
    # token string, so tokens that decode alike share one entry).
    for position, top in enumerate(logprobs["top_logprobs"][1:]):
        allowed = [reference[position, PROMPT_IDS[position + 1]].item(), *reference[position].topk(2).values.tolist()]
        assert 1 <= len(top) <= 3
        assert all(min(abs(value - a) for a in allowed) < TOLERANCE for value in top.values())
    assert answer["usage"]["completion_tokens"] == 0
    assert choice["finish_reason"] == "length"


def test_vllm_prompt_logprobs_field_has_ranks_and_ids(server, reference) -> None:
    answer = complete(server, max_tokens=3, prompt_logprobs=1, temperature=0)
    entries = answer["choices"][0]["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(PROMPT_IDS)
    for position, entry in enumerate(entries[1:]):
        token_id = PROMPT_IDS[position + 1]
        scored = entry[str(token_id)]
        assert scored["logprob"] == pytest.approx(reference[position, token_id].item(), abs=TOLERANCE)
        assert scored["rank"] == int((reference[position] > reference[position, token_id]).sum()) + 1
        top_id = int(reference[position].argmax())
        assert entry[str(top_id)]["rank"] == 1
    assert answer["usage"]["completion_tokens"] == 3
    assert answer["choices"][0]["logprobs"] is None  # no echo, no logprobs asked: the output has none


def test_cached_prompt_still_gets_every_logprob(server, reference) -> None:
    # Puts the prompt's full blocks in the prefix cache, then checks the scoring request skipped them.
    complete(server, max_tokens=1)
    again = complete(server, max_tokens=1)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    scored = complete(server, max_tokens=0, echo=True, logprobs=0)
    assert scored["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    got = torch.tensor(scored["choices"][0]["logprobs"]["token_logprobs"][1:])
    assert torch.allclose(got, torch.tensor(expected_logprobs(reference)), atol=TOLERANCE)


def test_streamed_echo_starts_with_the_prompt(server, reference) -> None:
    body = {"prompt": PROMPT_IDS, "max_tokens": 4, "echo": True, "logprobs": 0, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(event) for event in events if event != "[DONE]"]
    first = chunks[0]["choices"][0]["logprobs"]
    assert first["token_logprobs"][0] is None
    assert torch.allclose(torch.tensor(first["token_logprobs"][1 : len(PROMPT_IDS)]),
                          torch.tensor(expected_logprobs(reference)), atol=TOLERANCE)
    streamed = sum(len(chunk["choices"][0]["logprobs"]["tokens"]) for chunk in chunks if chunk["choices"])
    assert streamed == len(PROMPT_IDS) + 4


def test_echoed_text_offsets_continue_after_the_prompt_text(server) -> None:
    # The first prompt token is a special token: its string is listed, yet the echoed text leaves it out.
    body = {"prompt": PROMPT_IDS, "max_tokens": 3, "echo": True, "logprobs": 0, "temperature": 0}
    choice = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    offsets, tokens = choice["logprobs"]["text_offset"], choice["logprobs"]["tokens"]
    generated_text = "".join(tokens[len(PROMPT_IDS):])
    assert choice["text"].endswith(generated_text)
    assert offsets[len(PROMPT_IDS)] == len(choice["text"]) - len(generated_text)


def test_max_tokens_0_without_echo_is_refused(server) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 0},
                          timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"


def test_prompt_logprobs_out_of_range_is_refused(server) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions",
                          json={"prompt": PROMPT_IDS, "prompt_logprobs": 21}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_logprobs"
