"""vLLM's `return_token_ids` through the HTTP frontend on a fake engine: completions choices carry their
prompt's and their output's ids, chat responses the prompt's ids at the top and each choice's output ids; a
stream sends the prompt ids once (a completions choice's first chunk, a chat choice's opening chunk) and each
chunk's own output ids."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.unit.fake_engine import FakeEngine
from tests.unit.http_helpers import CHAT, sse_payloads

ROUTES = [("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", CHAT)]


def engine_ids(engine: FakeEngine) -> dict[int, tuple[list[int], list[int]]]:
    """Choice index -> (prompt ids, output ids) of the engine requests one HTTP request made."""
    # An engine request id is the response id, a dash and the choice index.
    return {int(request_id.rsplit("-", 1)[1]): (prompt_ids, engine.reply_token_ids(params))
            for request_id, prompt_ids, params in engine.requests}


async def test_completions_choices_carry_their_prompt_and_output_ids(client: httpx.AsyncClient, engine: FakeEngine,
                                                                      tokenizer: Any) -> None:
    response = await client.post("/v1/completions", json={"prompt": ["Hi", [5, 6, 7]], "n": 2,
                                                          "return_token_ids": True})
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    expected = engine_ids(engine)
    assert [(choice["prompt_token_ids"], choice["token_ids"]) for choice in choices] == [expected[i] for i in range(4)]
    assert choices[2]["prompt_token_ids"] == [5, 6, 7]
    assert all(tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == choice["text"] for choice in choices)


async def test_streamed_completions_send_prompt_ids_once_per_choice_and_each_chunks_output_ids(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/v1/completions", json={"prompt": "Hi", "n": 2, "stream": True,
                                                          "return_token_ids": True,
                                                          "stream_options": {"include_usage": True}})
    *chunks, usage = sse_payloads(response)
    expected = engine_ids(engine)
    output_ids: dict[int, list[int]] = {index: [] for index in expected}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        first = not output_ids[choice["index"]]
        assert choice.get("prompt_token_ids") == (expected[choice["index"]][0] if first else None)
        assert choice["token_ids"]
        output_ids[choice["index"]] += choice["token_ids"]
    assert output_ids == {index: ids for index, (_, ids) in expected.items()}
    assert len(chunks) > len(expected)  # several chunks per choice: the ids are per chunk, not repeated
    assert usage["choices"] == [] and "prompt_token_ids" not in usage


async def test_chat_carries_prompt_ids_on_the_response_and_output_ids_per_choice(client: httpx.AsyncClient,
                                                                                  engine: FakeEngine) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "n": 2, "return_token_ids": True})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = engine_ids(engine)
    assert body["prompt_token_ids"] == expected[0][0] == expected[1][0]
    assert [choice["token_ids"] for choice in body["choices"]] == [expected[0][1], expected[1][1]]
    assert all("prompt_token_ids" not in choice for choice in body["choices"])


async def test_streamed_chat_sends_prompt_ids_with_the_opening_chunk_and_each_chunks_output_ids(
        client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True, "return_token_ids": True})
    opening, *chunks = sse_payloads(response)
    ((prompt_ids, output_ids),) = engine_ids(engine).values()
    assert opening["prompt_token_ids"] == prompt_ids
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("prompt_token_ids" not in chunk for chunk in chunks)
    assert [token for chunk in chunks for token in chunk["choices"][0]["token_ids"]] == output_ids
    assert len(chunks) > 1


@pytest.mark.parametrize("fields", [{}, {"return_token_ids": False}, {"return_token_ids": None}])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("route", "body"), ROUTES)
async def test_no_token_ids_unless_asked(client: httpx.AsyncClient, route: str, body: dict[str, Any], stream: bool,
                                         fields: dict[str, Any]) -> None:
    response = await client.post(route, json={**body, **fields, "stream": stream})
    payloads = sse_payloads(response) if stream else [response.json()]
    for payload in payloads:
        assert "prompt_token_ids" not in payload
        assert all(not {"prompt_token_ids", "token_ids"} & set(choice) for choice in payload["choices"])
