"""The Anthropic Messages API request (`POST /v1/messages`), its translation into a chat request, and
Anthropic's error shape.

Key design choice: as for /v1/responses, the request becomes a `ChatCompletionRequest` -- `system` a
system turn, a user turn's `tool_result` blocks `tool` turns (before its text), an assistant turn's
`tool_use` blocks its `tool_calls` -- so templates, the tool plan (tool_choice any -> "required", tool ->
a named function, both grammar-constrained) and sampling checks are the chat route's. Every failure of
this route leaves as `{"type": "error", "error": {"type", "message"}}`, the body the anthropic SDK reads.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from starlette.responses import Response

from rapid_llm.frontend.errors import OpenAIError, bad_request
from rapid_llm.frontend.protocol import (
    ChatCompletionRequest, ChatMessage, ChatTool, FunctionCall, FunctionDefinition, FunctionName,
    NamedToolChoice, StreamOptions, ToolCall)

# Anthropic's error types by HTTP status (its SDK picks the exception class from the status).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error"}
RENAMED_PARAMS = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens"}
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def anthropic_error_body(error: OpenAIError) -> dict[str, Any]:
    message = error.message if error.param is None else f"{error.param}: {error.message}"
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(error.status, "api_error"), "message": message}}


def anthropic_error_response(error: OpenAIError) -> Response:
    return Response(msgspec.json.encode(anthropic_error_body(error)), status_code=error.status,
                    headers=error.headers, media_type="application/json")


class ContentBlock(msgspec.Struct, kw_only=True):
    """One content block: text, tool_use (id, name, input), tool_result (tool_use_id, content) or thinking;
    fields of the other kinds are ignored."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[ContentBlock] | None = None
    is_error: bool | None = None


class MessageParam(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # server tools (web_search_...) are refused


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class MessagesRequest(msgspec.Struct, kw_only=True):
    """The fields rapid_llm honours; unknown ones (metadata, service_tier, ...) are ignored."""

    model: str | None = None
    max_tokens: int
    messages: list[MessageParam]
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


def _text(blocks: str | list[ContentBlock] | None, param: str) -> str:
    """The text of a string or of text blocks (joined with newlines)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    for index, block in enumerate(blocks):
        if block.type != "text" or block.text is None:
            raise bad_request(f"only text blocks are supported here, got {block.type!r}", param=f"{param}[{index}].type")
    return "\n".join(block.text for block in blocks if block.text is not None)


def _turns(message: MessageParam, param: str) -> list[tuple[ChatMessage, str]]:
    """The chat turns of one message, each with the field it came from."""
    if isinstance(message.content, str):
        return [(ChatMessage(role=message.role, content=message.content), param)]
    texts: list[str] = []
    calls: list[ToolCall] = []
    turns: list[tuple[ChatMessage, str]] = []
    for index, block in enumerate(message.content):
        where = f"{param}.content[{index}]"
        kind = block.type
        if kind == "text" and block.text is not None:
            texts.append(block.text)
        elif kind == "tool_use" and message.role == "assistant" and block.id and block.name:
            calls.append(ToolCall(id=block.id, function=FunctionCall(block.name, json.dumps(block.input or {}))))
        elif kind == "tool_result" and message.role == "user" and block.tool_use_id:
            result = _text(block.content, f"{where}.content")
            turns.append((ChatMessage(role="tool", tool_call_id=block.tool_use_id,
                                      content=f"Error: {result}" if block.is_error else result), where))
        elif kind not in ("thinking", "redacted_thinking"):  # past thinking: templates leave it out
            raise bad_request(f"a {message.role} message cannot hold a {kind!r} block here (supported: text; "
                              "tool_use with id and name from the assistant; tool_result with tool_use_id from "
                              "the user)", param=f"{where}.type")
    if texts or calls or not turns:
        turns.append((ChatMessage(role=message.role, content="\n".join(texts), tool_calls=calls or None), param))
    return turns


def _tools(tools: list[Tool] | None) -> list[ChatTool] | None:
    if tools is None:
        return None
    for index, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise bad_request(f"tool type {tool.type!r} is not supported; only client tools (name, description, "
                              "input_schema) are", param=f"tools[{index}].type")
    return [ChatTool(FunctionDefinition(tool.name, tool.description, tool.input_schema)) for tool in tools]


def _tool_choice(choice: ToolChoice | None) -> str | NamedToolChoice | None:
    if choice is None:
        return None
    if choice.type == "tool":
        if choice.name is None:
            raise bad_request('tool_choice of type "tool" needs the tool\'s name', param="tool_choice.name")
        return NamedToolChoice(FunctionName(choice.name))
    return _TOOL_CHOICES[choice.type]


class MessagesTranslation:
    """The chat request of a Messages request, and the Messages field behind each chat message."""

    def __init__(self, body: MessagesRequest) -> None:
        sourced: list[tuple[ChatMessage, str]] = []
        if body.system is not None:
            sourced.append((ChatMessage(role="system", content=_text(body.system, "system")), "system"))
        for index, message in enumerate(body.messages):
            sourced.extend(_turns(message, f"messages[{index}]"))
        self.sources = [source for _, source in sourced]
        choice = body.tool_choice
        template_kwargs = None if body.thinking is None else {"enable_thinking": body.thinking.type != "disabled"}
        self.chat = ChatCompletionRequest(
            messages=[message for message, _ in sourced], tools=_tools(body.tools), tool_choice=_tool_choice(choice),
            parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
            max_tokens=body.max_tokens, stop=body.stop_sequences, temperature=body.temperature, top_p=body.top_p,
            top_k=body.top_k, stream=body.stream, chat_template_kwargs=template_kwargs,
            # message_delta ends the stream with the usage, so it is always asked of the chat stream.
            stream_options=StreamOptions(include_usage=True))
