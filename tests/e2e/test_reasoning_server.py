"""--reasoning-parser on the real server through the openai SDK. A random model never writes a think block
by itself, so a regex (structured output) makes it write one: `<think>`, a few letters, `</think>`, a few
letters, tags and all generated token by token through the engine, detokenizer and chat route."""

from __future__ import annotations

import re
from typing import Any, Iterator

import openai
import pytest

from tests.e2e.conftest import API_KEY
from tests.e2e.server import ServerProcess
from tests.e2e.test_startup_errors import launch
from tests.unit.test_frontend_reasoning import THINKING_TEMPLATE

THINK_THEN_ANSWER = r"<think>[a-z]{1,8}</think>[a-z]{1,8}"
MESSAGES = [{"role": "user", "content": "Think, then answer."}]


@pytest.fixture(scope="module")
def reasoning_server(checkpoint) -> Iterator[ServerProcess]:
    # --chat-template takes the template inline too.
    process = ServerProcess("--model", str(checkpoint), "--served-model-name", "tiny", "--api-key", API_KEY,
                            "--chat-template", THINKING_TEMPLATE, "--reasoning-parser", "qwen3",
                            "--num-kv-blocks", "64", "--log-level", "warning")
    yield process
    process.stop()


@pytest.fixture
def reasoning_client(reasoning_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{reasoning_server.base_url}/v1", api_key=API_KEY, max_retries=0)


def request(regex: str, seed: int, **extra: Any) -> dict[str, Any]:
    # 40 tokens outlast the regex's longest match (each token is at least one character).
    return {"model": "tiny", "messages": MESSAGES, "max_tokens": 40, "temperature": 1.0, "seed": seed,
            "extra_body": {"structured_outputs": {"regex": regex}, **extra}}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_think_block_comes_back_as_reasoning_content(reasoning_client: openai.OpenAI, seed: int) -> None:
    choice = reasoning_client.chat.completions.create(**request(THINK_THEN_ANSWER, seed)).choices[0]
    assert choice.finish_reason == "stop"
    message = choice.message
    assert re.fullmatch("[a-z]{1,8}", message.reasoning_content) and re.fullmatch("[a-z]{1,8}", message.content)
    deltas = [chunk.choices[0].delta for chunk in reasoning_client.chat.completions.create(
        stream=True, **request(THINK_THEN_ANSWER, seed)) if chunk.choices]
    assert "".join(getattr(delta, "reasoning_content", None) or "" for delta in deltas) == message.reasoning_content
    assert "".join(delta.content or "" for delta in deltas) == message.content


def test_enable_thinking_false_reaches_the_template(reasoning_client: openai.OpenAI) -> None:
    thinking = reasoning_client.chat.completions.create(**request("[a-z]{1,8}", 0))
    no_thinking = reasoning_client.chat.completions.create(
        **request("[a-z]{1,8}", 0, chat_template_kwargs={"enable_thinking": False}))
    # The template wrote the empty think block into the prompt; the reply has none, so it is all content.
    assert no_thinking.usage.prompt_tokens > thinking.usage.prompt_tokens
    message = no_thinking.choices[0].message
    assert message.reasoning_content is None and re.fullmatch("[a-z]{1,8}", message.content)


def test_an_unknown_reasoning_parser_is_one_line_listing_the_choices() -> None:
    code, lines, _ = launch("--reasoning-parser", "r1")
    assert code == 2
    assert len(lines) == 1 and "unknown --reasoning-parser 'r1'; known: deepseek_r1, qwen3" in lines[0]
