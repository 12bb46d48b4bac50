"""One real server (subprocess) shared by the end-to-end tests, on a tiny random Llama."""

from __future__ import annotations

from typing import Iterator

import openai
import pytest

from tests.e2e.server import ServerProcess

API_KEY = "test-key"
SERVER_MAX_MODEL_LEN = 2048
# A request that outlasts every sleep and grace period of the lifecycle tests however fast the tiny model
# decodes (~1 ms a token on the 2-core CPU: 1900 tokens no longer outlasted a 2 s grace period).
LONG_TOKENS = 16000
LONG_REQUEST = {"prompt": "keep going", "max_tokens": LONG_TOKENS, "ignore_eos": True}


def long_kv_blocks(requests: int) -> str:
    """--num-kv-blocks for `requests` concurrent long requests in 16-token blocks."""
    return str(requests * (LONG_TOKENS + 64) // 16)


@pytest.fixture(scope="session")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("LlamaForCausalLM")


@pytest.fixture(scope="session")
def long_checkpoint(tiny_checkpoint):
    """The same weights and tokenizer, with room for LONG_REQUEST."""
    return tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=LONG_TOKENS + 64)


@pytest.fixture(scope="session")
def server_checkpoint(tiny_checkpoint):
    """The same weights and tokenizer, with room for the ~1000-token prompts of the prefix-cache tests."""
    return tiny_checkpoint("LlamaForCausalLM", max_position_embeddings=SERVER_MAX_MODEL_LEN)


@pytest.fixture(scope="session")
def server(server_checkpoint) -> Iterator[ServerProcess]:
    process = ServerProcess("--model", str(server_checkpoint), "--served-model-name", "tiny", "--api-key", API_KEY,
                            "--num-kv-blocks", "256", "--max-num-seqs", "64", "--log-level", "warning")
    yield process
    process.stop()


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def async_client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
