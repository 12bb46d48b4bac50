"""The OpenAI Responses API request (`POST /v1/responses`) and its translation into a chat request.

Key design choice: a Responses request becomes a `ChatCompletionRequest` -- `instructions` a system turn,
the stored conversation of `previous_response_id` next, then the `input` items (messages, function calls
merged into one assistant turn with `tool_calls`, function call outputs as `tool` turns) -- so the chat
template, tool plan and sampling checks are the chat route's. Each chat message remembers the Responses
field it came from, so an error the chat checks raise names `input[3]`, not `messages[4]`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.protocol import (
    ChatCompletionRequest, ChatMessage, ChatTool, FunctionCall, FunctionDefinition, FunctionName,
    NamedToolChoice, StreamOptions, ToolCall)
from rapid_llm.frontend.structured_request import JsonSchemaFormat, ResponseFormat

# Content part types holding plain text (an assistant turn replayed from `output` has output_text).
_TEXT_PARTS = ("input_text", "output_text", "text")
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
# Chat request fields whose Responses names differ.
RENAMED_PARAMS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
                   "response_format": "text.format", "messages": "input"}


class InputContent(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """One `input` item: a message (`type` may be left out), function_call, function_call_output or
    reasoning; fields of the other kinds are ignored."""

    type: str = "message"
    role: str | None = None
    content: str | list[InputContent] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputContent] | None = None


class FunctionTool(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(msgspec.Struct, kw_only=True):
    type: Literal["function"]
    name: str


class TextFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class TextConfig(msgspec.Struct, kw_only=True):
    format: TextFormat | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    """The fields rapid_llm honours; unknown ones are ignored, as OpenAI clients send extras."""

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


def _text(content: str | list[InputContent] | None, param: str) -> str | None:
    if not isinstance(content, list):
        return content
    for index, part in enumerate(content):
        if part.type not in _TEXT_PARTS or part.text is None:
            raise bad_request(f"content part type {part.type!r} is not supported; only text parts "
                              f"({', '.join(_TEXT_PARTS)}) are", param=f"{param}[{index}].type")
    return "\n".join(part.text for part in content if part.text is not None)


def _required(value: str | None, param: str, kind: str) -> str:
    if value is None:
        raise bad_request(f"a {kind} item needs {param.rsplit('.', 1)[-1]}", param=param)
    return value


def _call(item: InputItem, param: str) -> ToolCall:
    arguments = _required(item.arguments, f"{param}.arguments", "function_call")
    try:
        json.loads(arguments)
    except ValueError:
        raise bad_request("function_call arguments must be a JSON object serialised as a string",
                          param=f"{param}.arguments") from None
    return ToolCall(id=_required(item.call_id, f"{param}.call_id", "function_call"),
                    function=FunctionCall(_required(item.name, f"{param}.name", "function_call"), arguments))


class Conversation:
    """Chat messages, each with the Responses field it came from."""

    def __init__(self) -> None:
        self.messages: list[ChatMessage] = []
        self.sources: list[str] = []

    def add(self, message: ChatMessage, source: str) -> None:
        self.messages.append(message)
        self.sources.append(source)

    def add_item(self, item: InputItem, param: str) -> None:
        if item.type == "message":
            if item.role not in _MESSAGE_ROLES:
                raise bad_request(f"role must be one of {', '.join(_MESSAGE_ROLES)}, got {item.role!r}",
                                  param=f"{param}.role")
            self.add(ChatMessage(role=item.role, content=_text(item.content, f"{param}.content")), param)
        elif item.type == "function_call":
            call = _call(item, param)
            last = self.messages[-1] if self.messages else None
            # Consecutive calls (and the text before them) are one assistant turn, as chat templates expect.
            if last is not None and last.role == "assistant" and self.sources[-1].startswith("input"):
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                self.add(ChatMessage(role="assistant", tool_calls=[call]), param)
        elif item.type == "function_call_output":
            output = _text(item.output, f"{param}.output")
            self.add(ChatMessage(role="tool", tool_call_id=_required(item.call_id, f"{param}.call_id",
                                                                     "function_call_output"),
                                 content=_required(output, f"{param}.output", "function_call_output")), param)
        elif item.type != "reasoning":  # a replayed reasoning item: templates leave past thinking out
            raise bad_request(f"input item type {item.type!r} is not supported; supported: message, function_call, "
                              "function_call_output, reasoning", param=f"{param}.type")


def _tools(tools: list[FunctionTool] | None) -> list[ChatTool] | None:
    if tools is None:
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            raise bad_request(f"tool type {tool.type!r} is not supported; only function tools are",
                              param=f"tools[{index}].type")
        name = _required(tool.name, f"tools[{index}].name", "function tool")
        chat_tools.append(ChatTool(FunctionDefinition(name, tool.description, tool.parameters, tool.strict)))
    return chat_tools


def _response_format(text: TextConfig | None) -> ResponseFormat | None:
    if text is None or text.format is None:
        return None
    fmt = text.format
    schema = JsonSchemaFormat(name=fmt.name, description=fmt.description, schema=fmt.schema, strict=fmt.strict)
    return ResponseFormat(type=fmt.type, json_schema=schema if fmt.type == "json_schema" else None)


def chat_request(body: ResponsesRequest, history: list[ChatMessage]) -> tuple[ChatCompletionRequest, Conversation]:
    """The chat request `body` stands for, after the stored conversation `history`."""
    conversation = Conversation()
    if body.instructions is not None:
        conversation.add(ChatMessage(role="system", content=body.instructions), "instructions")
    for message in history:
        conversation.add(message, "previous_response_id")
    if isinstance(body.input, str):
        conversation.add(ChatMessage(role="user", content=body.input), "input")
    else:
        for index, item in enumerate(body.input):
            conversation.add_item(item, f"input[{index}]")
    choice = body.tool_choice
    tool_choice = NamedToolChoice(FunctionName(choice.name)) if isinstance(choice, NamedFunction) else choice
    chat = ChatCompletionRequest(
        messages=conversation.messages, tools=_tools(body.tools), tool_choice=tool_choice,
        parallel_tool_calls=body.parallel_tool_calls, max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature, top_p=body.top_p, stream=body.stream,
        # The Responses stream ends with the usage, so it is always asked of the chat stream.
        stream_options=StreamOptions(include_usage=True), response_format=_response_format(body.text))
    return chat, conversation
