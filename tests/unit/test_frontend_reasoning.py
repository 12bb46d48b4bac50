"""--reasoning-parser through the HTTP app and the real `openai` SDK, on an engine whose reply the test sets:
`reasoning_content` in whole and streamed replies, tool calls read from the content after the think block,
and `chat_template_kwargs.enable_thinking` reaching the chat template."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

import httpx
import openai
import pytest

from rapid_llm.frontend.app import build_app
from rapid_llm.frontend.options import FrontendOptions
from tests.unit.http_helpers import CHAT, http_client, sse_payloads
from tests.unit.test_frontend_tools import HERMES_REPLY, TOOLS, ScriptedEngine
from tests.unit.tool_fixtures import TOOL_TEMPLATE

THOUGHT = "The user wants the weather; I should call the tool."
# Qwen3's switch: with enable_thinking false the template writes an empty think block itself.
THINKING_TEMPLATE = (
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def options(parser: str, template: str = TOOL_TEMPLATE) -> FrontendOptions:
    return FrontendOptions(chat_template=template, tool_call_parser="hermes", enable_auto_tool_choice=True,
                           reasoning_parser=parser)


@pytest.fixture
def engine(tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(tokenizer, max_model_len=512)


@pytest.fixture
async def qwen3(engine: ScriptedEngine) -> AsyncIterator[openai.AsyncOpenAI]:
    async with http_client(build_app(engine, options("qwen3"))) as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http, max_retries=0)


async def stream_parts(sdk: openai.AsyncOpenAI, **kwargs: Any) -> tuple[str, str, list[Any]]:
    """(reasoning, content, deltas) of a streamed reply."""
    deltas = [chunk.choices[0].delta async for chunk in await sdk.chat.completions.create(
        model="tiny", stream=True, **CHAT, **kwargs) if chunk.choices]
    reasoning = "".join(getattr(delta, "reasoning_content", None) or "" for delta in deltas)
    return reasoning, "".join(delta.content or "" for delta in deltas), deltas


@pytest.mark.parametrize("tokens_per_delta", [1, 2, 5])
async def test_the_think_block_is_reasoning_content_whole_and_streamed(
    qwen3: openai.AsyncOpenAI, engine: ScriptedEngine, tokens_per_delta: int
) -> None:
    engine.script = f"<think>{THOUGHT}</think>\n\nIt is sunny."
    engine.tokens_per_delta = tokens_per_delta
    message = (await qwen3.chat.completions.create(model="tiny", **CHAT)).choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, "\n\nIt is sunny.")
    reasoning, content, deltas = await stream_parts(qwen3)
    assert (reasoning, content) == (THOUGHT, "\n\nIt is sunny.")
    assert not any("think>" in (delta.content or "") + (getattr(delta, "reasoning_content", None) or "")
                   for delta in deltas)


async def test_a_reply_without_a_think_block_is_content(qwen3: openai.AsyncOpenAI, engine: ScriptedEngine) -> None:
    engine.script = "It is sunny."
    message = (await qwen3.chat.completions.create(model="tiny", **CHAT)).choices[0].message
    assert (message.reasoning_content, message.content) == (None, "It is sunny.")
    assert (await stream_parts(qwen3))[:2] == ("", "It is sunny.")


async def test_a_tool_call_after_the_think_block_is_parsed_from_the_content(
    qwen3: openai.AsyncOpenAI, engine: ScriptedEngine
) -> None:
    engine.script = f"<think>{THOUGHT}</think>{HERMES_REPLY}"
    choice = (await qwen3.chat.completions.create(model="tiny", tools=TOOLS, **CHAT)).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.reasoning_content, choice.message.content) == (THOUGHT, "Let me check.\n")
    assert [json.loads(call.function.arguments)["city"] for call in choice.message.tool_calls] == ["Paris", "Rome"]
    async with qwen3.chat.completions.stream(model="tiny", tools=TOOLS, **CHAT) as stream:
        final = (await stream.get_final_completion()).choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "Let me check.\n"
    assert [call.function.arguments for call in final.message.tool_calls] == [
        call.function.arguments for call in choice.message.tool_calls]


async def test_deepseek_r1_starts_in_reasoning_and_an_unclosed_block_is_all_reasoning(engine: ScriptedEngine) -> None:
    async with http_client(build_app(engine, options("deepseek_r1"))) as client:
        engine.script = f"{THOUGHT}</think>It is sunny."
        body = (await client.post("/v1/chat/completions", json=CHAT)).json()
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny.",
                                                 "reasoning_content": THOUGHT}
        engine.script = THOUGHT
        body = (await client.post("/v1/chat/completions", json=CHAT)).json()
        assert body["choices"][0]["message"] == {"role": "assistant", "content": None, "reasoning_content": THOUGHT}
        chunks = sse_payloads(await client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
        deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
        assert "".join(delta.get("reasoning_content", "") for delta in deltas) == THOUGHT
        assert "".join(delta.get("content", "") for delta in deltas) == ""


async def test_without_the_flag_the_think_block_stays_content(client: httpx.AsyncClient, engine: Any) -> None:
    engine.script = f"<think>{THOUGHT}</think>4"
    async with http_client(build_app(engine, FrontendOptions(chat_template=TOOL_TEMPLATE))) as plain:
        body = (await plain.post("/v1/chat/completions", json=CHAT)).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": f"<think>{THOUGHT}</think>4"}


async def test_enable_thinking_reaches_the_chat_template(engine: ScriptedEngine) -> None:
    async with http_client(build_app(engine, options("qwen3", THINKING_TEMPLATE))) as client:
        for kwargs, expected in [({}, "assistant\n"), ({"enable_thinking": True}, "assistant\n"),
                                 ({"enable_thinking": False}, "assistant\n<think>\n\n</think>\n\n")]:
            response = await client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": kwargs})
            assert response.status_code == 200
            assert engine.tokenizer.decode(engine.requests[-1][1]).endswith(expected), kwargs
