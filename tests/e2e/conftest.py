"""One real server (subprocess) shared by the end-to-end tests, on a tiny random Llama."""

from __future__ import annotations

from typing import Iterator

import openai
import pytest

from tests.e2e.server import ServerProcess

API_KEY = "test-key"


@pytest.fixture(scope="session")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM")


@pytest.fixture(scope="session")
def server(checkpoint) -> Iterator[ServerProcess]:
    process = ServerProcess("--model", str(checkpoint), "--served-model-name", "tiny", "--api-key", API_KEY,
                            "--num-kv-blocks", "256", "--max-num-seqs", "64", "--log-level", "warning")
    yield process
    process.stop()


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def async_client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
