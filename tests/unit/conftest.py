"""Fixtures of the frontend tests: the tiny tokenizer, a fake engine, an HTTP client and the OpenAI SDK on the app."""

from __future__ import annotations

from typing import Any, AsyncIterator

import httpx
import openai
import pytest

from rapid_llm.frontend.app import build_app
from rapid_llm.utils.tiny_checkpoint import build_tokenizer
from tests.unit.fake_engine import FakeEngine
from tests.unit.http_helpers import http_client


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def engine(tokenizer: Any) -> FakeEngine:
    return FakeEngine(tokenizer)


@pytest.fixture
async def client(engine: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(build_app(engine)) as http:
        yield http


@pytest.fixture
async def sdk(engine: FakeEngine) -> AsyncIterator[openai.AsyncOpenAI]:
    async with http_client(build_app(engine)) as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)
