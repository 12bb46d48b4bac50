"""Beam search over HTTP and the offline API: completions and chat return the n best beams, equal to
transformers `generate(num_beams=...)`; the fields beam search cannot take are 400s naming them; every KV
block is free afterwards."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer

from rapid_llm import LLM
from tests.e2e.conftest import API_KEY
from tests.hf_reference import hf_model

PROMPT = torch.randint(10, 500, (9,), generator=torch.Generator().manual_seed(5)).tolist()
MAX_TOKENS = 8


def _hf_beams(checkpoint, width: int, n: int, length_penalty: float = 1.0) -> list[list[int]]:
    model = hf_model(checkpoint)
    eos = model.config.eos_token_id
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), num_beams=width, num_return_sequences=n, do_sample=False,
                             max_new_tokens=MAX_TOKENS, length_penalty=length_penalty, early_stopping=False,
                             eos_token_id=eos, pad_token_id=eos)
    beams = []
    for sequence in out[:, len(PROMPT):].tolist():
        beams.append(sequence[: sequence.index(eos) + 1] if eos in sequence else sequence)
    return beams


def test_completion_beams_equal_transformers(server, server_checkpoint, client: openai.OpenAI) -> None:
    response = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, n=2, best_of=4,
                                         extra_body={"use_beam_search": True, "length_penalty": 0.5})
    tokenizer = AutoTokenizer.from_pretrained(server_checkpoint)
    expected = [tokenizer.decode(beam, skip_special_tokens=True)
                for beam in _hf_beams(server_checkpoint, 4, 2, length_penalty=0.5)]
    assert [choice.text for choice in response.choices] == expected
    assert [choice.index for choice in response.choices] == [0, 1]
    assert response.usage.prompt_tokens == len(PROMPT)
    assert server.wait_until_idle()["rapid_llm:kv_cache_blocks_used"] == 0


def test_chat_beam_search_returns_n_choices(server, client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello there"}],
                                              max_tokens=6, n=3, extra_body={"use_beam_search": True})
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    assert len({choice.message.content for choice in response.choices}) == 3
    assert all(choice.finish_reason in ("stop", "length") for choice in response.choices)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"stream": True}, "stream"),
        ({"temperature": 0.7}, "temperature"),
        ({"best_of": 11}, "best_of"),
        ({"n": 11}, "n"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"stop": ["x"]}, "stop"),
        ({"early_stopping": "sometimes"}, "early_stopping"),
        ({"echo": True, "max_tokens": 0}, "max_tokens"),
    ],
)
def test_what_beam_search_refuses_is_a_400_naming_the_field(server, extra, param) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "use_beam_search": True, **extra}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body,
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_offline_beam_search_equals_transformers(checkpoint) -> None:
    with LLM(model=str(checkpoint), num_kv_blocks=64, block_size=4, max_model_len=64) as llm:
        (result,) = llm.beam_search([PROMPT], beam_width=3, max_tokens=MAX_TOKENS, n=3)
    assert [output.token_ids for output in result.outputs] == _hf_beams(checkpoint, 3, 3)
    assert [output.index for output in result.outputs] == [0, 1, 2]
    scores = [output.cumulative_logprob / len(output.token_ids) for output in result.outputs]
    assert scores == sorted(scores, reverse=True)
