"""POST /tokenize and /detokenize, with vLLM's request and response shapes.

/tokenize takes a `prompt` (special tokens added unless `add_special_tokens` is false) or chat
`messages` (rendered by the chat template exactly as /v1/chat/completions renders them, special
tokens not added again unless asked) and returns `tokens`, `count`, `max_model_len` and, with
`return_token_strs`, each token's string. /detokenize turns `tokens` back into `prompt` text.
Usage: `client.post("/tokenize", json={"prompt": "Hello"})`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.protocol import ChatCompletionRequest, ChatMessage, ChatTool
from rapid_llm.frontend.serving_chat import chat_prompt_text
from rapid_llm.frontend.serving_common import Serving, json_response


class TokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (as vLLM)
    add_generation_prompt: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int]


async def tokenize(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, TokenizeRequest)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give exactly one of prompt and messages", param="prompt")
    if body.messages is not None:
        chat = ChatCompletionRequest(messages=body.messages, add_generation_prompt=body.add_generation_prompt,
                                     chat_template=body.chat_template, chat_template_kwargs=body.chat_template_kwargs,
                                     tools=body.tools)
        text, param, add_special_tokens = await chat_prompt_text(serving, chat), "messages", False
    else:
        text, param, add_special_tokens = body.prompt, "prompt", True
    if body.add_special_tokens is not None:
        add_special_tokens = body.add_special_tokens
    serving.check_text_length(len(text), param)
    tokens = await asyncio.to_thread(serving.engine.tokenizer.encode, text, add_special_tokens=add_special_tokens)
    result: dict[str, Any] = {"count": len(tokens), "max_model_len": serving.engine.max_model_len, "tokens": tokens,
                              "token_strs": None}
    if body.return_token_strs:
        result["token_strs"] = serving.engine.tokenizer.convert_ids_to_tokens(tokens)
    return json_response(result)


async def detokenize(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, DetokenizeRequest)
    if body.tokens:
        serving.check_prompt_ids(body.tokens, "tokens")
    return json_response({"prompt": await serving.decode(body.tokens, skip_special_tokens=False)})
