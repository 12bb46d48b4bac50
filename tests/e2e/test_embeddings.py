"""/v1/embeddings through the real server and the OpenAI SDK, against transformers' final hidden states.

A tiny random Qwen3 checkpoint (Qwen3-Embedding's architecture) in float32: last-token pooling by default, and
mean pooling when the folder declares it the sentence-transformers way; each with the prompt in one chunk and
in 16-token chunks, and served twice (the second time from the prefix cache, which mean pooling skips).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest
import torch
import transformers

from rapid_llm import LLM
from tests.e2e.server import ServerProcess

TOLERANCE = 1e-4
PROMPTS = [[1, *range(40, 90)], [1, 7, 8, 9]]  # 51 tokens (four 16-token chunks) and a short one


@pytest.fixture(scope="module")
def qwen3_checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint("Qwen3ForCausalLM")


def with_pooling(checkpoint: Path, target: Path, mode: str) -> Path:
    """A copy of `checkpoint` that declares sentence-transformers pooling `mode` (and normalisation)."""
    shutil.copytree(checkpoint, target)
    (target / "1_Pooling").mkdir()
    (target / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, mode: True}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (target / "modules.json").write_text(json.dumps(modules))
    return target


@pytest.fixture(scope="module")
def hidden_states(qwen3_checkpoint) -> list[torch.Tensor]:
    """transformers' final (normed) hidden states [tokens, hidden] of each prompt."""
    model = transformers.AutoModel.from_pretrained(qwen3_checkpoint, dtype=torch.float32)
    with torch.no_grad():
        return [model(torch.tensor([ids])).last_hidden_state[0] for ids in PROMPTS]


@pytest.fixture(scope="module", params=[("last", "one chunk"), ("last", "chunked"), ("mean", "chunked")],
                ids=["last-one-chunk", "last-chunked", "mean-chunked"])
def served(request, qwen3_checkpoint, tmp_path_factory) -> Iterator[tuple[ServerProcess, str]]:
    pooling, chunking = request.param
    checkpoint = qwen3_checkpoint
    if pooling == "mean":
        checkpoint = with_pooling(qwen3_checkpoint, tmp_path_factory.mktemp("mean") / "ckpt",
                                  "pooling_mode_mean_tokens")
    budget = ["--max-num-batched-tokens", "16"] if chunking == "chunked" else []
    process = ServerProcess("--model", str(checkpoint), "--dtype", "float32", "--num-kv-blocks", "64",
                            "--log-level", "warning", *budget)
    yield process, pooling
    process.stop()


def expected(states: torch.Tensor, pooling: str) -> torch.Tensor:
    vector = states[-1] if pooling == "last" else states.mean(dim=0)
    return torch.nn.functional.normalize(vector, dim=0)


def test_embeddings_match_transformers_pooled_hidden_states(served, hidden_states) -> None:
    server, pooling = served
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    for attempt in ("cold", "prefix cached"):
        # The SDK asks for base64 by default and decodes it; the float list is checked below.
        answer = client.embeddings.create(model=client.models.list().data[0].id, input=PROMPTS)
        assert [item.index for item in answer.data] == [0, 1], attempt
        for item, states in zip(answer.data, hidden_states):
            got = torch.tensor(item.embedding)
            assert torch.allclose(got, expected(states, pooling), atol=TOLERANCE), (attempt, pooling)
        assert answer.usage.prompt_tokens == sum(len(ids) for ids in PROMPTS)
        assert answer.usage.total_tokens == answer.usage.prompt_tokens


def test_float_encoding_unnormalised_and_text_input(served, hidden_states, qwen3_checkpoint) -> None:
    server, pooling = served
    response = httpx.post(f"{server.base_url}/v1/embeddings", timeout=60, json={
        "input": PROMPTS[0], "encoding_format": "float", "normalize": False})
    assert response.status_code == 200, response.text
    vector = torch.tensor(response.json()["data"][0]["embedding"])
    raw = hidden_states[0][-1] if pooling == "last" else hidden_states[0].mean(dim=0)
    assert torch.allclose(vector, raw, atol=TOLERANCE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(qwen3_checkpoint)
    text = httpx.post(f"{server.base_url}/v1/embeddings", timeout=60, json={"input": "def main():"}).json()
    by_ids = httpx.post(f"{server.base_url}/v1/embeddings", timeout=60,
                        json={"input": tokenizer.encode("def main():")}).json()
    assert torch.allclose(torch.tensor(text["data"][0]["embedding"]), torch.tensor(by_ids["data"][0]["embedding"]),
                          atol=TOLERANCE)


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[1, 2], [10**9]]}, "input"),
    ({"input": "x", "dimensions": 8}, "dimensions"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"input": list(range(1, 3000))}, "input"),
])
def test_bad_input_is_a_400_naming_the_field(served, body, param) -> None:
    server, _ = served
    response = httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    # The server keeps serving.
    assert httpx.post(f"{server.base_url}/v1/embeddings", json={"input": "ok"}, timeout=60).status_code == 200


def test_offline_embed_matches_transformers(qwen3_checkpoint, hidden_states) -> None:
    with LLM(str(qwen3_checkpoint), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=16) as llm:
        outputs = llm.embed(PROMPTS)
        raw = llm.embed(PROMPTS[0], normalize=False)[0].outputs.embedding
    for output, ids, states in zip(outputs, PROMPTS, hidden_states):
        assert output.prompt_token_ids == ids
        assert torch.allclose(torch.tensor(output.outputs.embedding), expected(states, "last"), atol=TOLERANCE)
    assert torch.allclose(torch.tensor(raw), hidden_states[0][-1], atol=TOLERANCE)
