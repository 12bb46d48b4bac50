"""--generation-config: the checkpoint's sampling defaults, applied only where a request leaves a field unset."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from rapid_llm.config.generation_defaults import generation_defaults
from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.protocol import CompletionRequest, decode_request
from tests.unit.fake_engine import FakeEngine
from tests.unit.http_helpers import http_client


def write_generation_config(directory, **values) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": 1, **values}))


def test_auto_reads_the_model_dir_and_skips_transformers_defaults(tmp_path) -> None:
    write_generation_config(tmp_path, temperature=0.6, top_p=0.9, top_k=50, repetition_penalty=1.0,
                            max_new_tokens=256, do_sample=True)
    assert generation_defaults("auto", str(tmp_path)) == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 256}


def test_vllm_ignores_the_file_and_auto_without_one_gives_none(tmp_path) -> None:
    write_generation_config(tmp_path, temperature=0.6)
    assert generation_defaults("vllm", str(tmp_path)) == {}
    assert generation_defaults("auto", str(tmp_path / "elsewhere")) == {}


def test_a_directory_setting_reads_that_directory(tmp_path) -> None:
    write_generation_config(tmp_path / "gen", top_k=20, min_p=0.05)
    assert generation_defaults(str(tmp_path / "gen"), str(tmp_path)) == {"top_k": 20, "min_p": 0.05}
    with pytest.raises(ValueError, match="^--generation-config .* is not a directory holding generation_config.json"):
        generation_defaults(str(tmp_path / "missing"), str(tmp_path))


def test_the_engine_config_carries_the_defaults(tiny_checkpoint, tmp_path) -> None:
    from rapid_llm.server_args import ServerArgs

    directory = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint(), directory)
    write_generation_config(directory, temperature=0.3)
    assert ServerArgs().engine_config(str(directory)).sampling_defaults == {"temperature": 0.3}
    assert ServerArgs(generation_config="vllm").engine_config(str(directory)).sampling_defaults == {}


DEFAULTS = {"temperature": 0.6, "top_k": 20, "max_tokens": 64}


def test_requests_get_the_defaults_only_for_unset_fields() -> None:
    unset = decode_request(b'{"prompt": "hi"}', CompletionRequest).sampling_params(16, DEFAULTS)
    assert (unset.temperature, unset.top_k) == (0.6, 20)
    explicit = decode_request(b'{"prompt": "hi", "temperature": 0, "top_k": null}', CompletionRequest)
    assert (explicit.sampling_params(16, DEFAULTS).temperature, explicit.sampling_params(16, DEFAULTS).top_k) == (0.0, 20)


async def test_chat_without_max_tokens_uses_max_new_tokens_capped_by_the_context(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer, max_model_len=128)
    chat = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    async with http_client(build_app(engine, FrontendOptions(sampling_defaults=DEFAULTS))) as http:
        assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        assert engine.requests[-1][2].max_tokens == 64
        assert (await http.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 5})).status_code == 200
        assert engine.requests[-1][2].max_tokens == 5
    async with http_client(build_app(engine, FrontendOptions(sampling_defaults={"max_tokens": 1000}))) as http:
        assert (await http.post("/v1/chat/completions", json=chat)).status_code == 200
        num_prompt_tokens = len(engine.requests[-1][1])
        assert engine.requests[-1][2].max_tokens == 128 - num_prompt_tokens


@pytest.mark.parametrize("values", [{"top_p": 0}, {"temperature": -1.0}, {"max_new_tokens": 0},
                                    {"temperature": "0.7"}])
def test_unusable_defaults_are_refused_at_start_up(tmp_path, values) -> None:
    write_generation_config(tmp_path, **values)
    with pytest.raises(ValueError, match="^--generation-config: .* holds an unusable sampling default"):
        generation_defaults("auto", str(tmp_path))


async def test_completions_without_max_tokens_also_take_max_new_tokens(tokenizer: Any) -> None:
    engine = FakeEngine(tokenizer, max_model_len=128)
    async with http_client(build_app(engine, FrontendOptions(sampling_defaults={"max_tokens": 20}))) as http:
        response = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": None})
        assert response.status_code == 200, response.text
        assert engine.requests[-1][2].max_tokens == 20
