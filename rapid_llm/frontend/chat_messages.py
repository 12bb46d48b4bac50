"""Chat messages checked as OpenAI checks them, and turned into the dicts chat templates expect.

Key design choice: as vLLM does, an assistant turn's tool-call arguments (JSON strings on the wire)
are handed to the template parsed, since templates write them with `tojson`; and every check names
the offending field (`messages[2].content`), so a client sees which turn is wrong.
"""

from __future__ import annotations

import json
from typing import Any

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.protocol import ChatMessage

# Roles whose turns must say something (an assistant turn may instead call tools).
_CONTENT_REQUIRED = ("system", "developer", "user", "tool", "function")


def _text(message: ChatMessage, param: str) -> str | None:
    """The content as text; text parts are joined with newlines like vLLM does."""
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise bad_request("only text content parts are supported", param=param)
        return "\n".join(part.text for part in content if part.text is not None)
    return content


def _tool_call(call: Any, param: str) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        raise bad_request("tool call arguments must be a JSON object serialised as a string",
                          param=f"{param}.function.arguments") from None
    return {"id": call.id, "type": call.type, "function": {"name": call.function.name, "arguments": arguments}}


def message_dict(message: ChatMessage, index: int) -> dict[str, Any]:
    param = f"messages[{index}]"
    content = _text(message, f"{param}.content")
    if content is None and (message.role in _CONTENT_REQUIRED or not message.tool_calls):
        raise bad_request(f"{param} ({message.role}) has no content", param=f"{param}.content")
    rendered: dict[str, Any] = {"role": message.role, "content": content or ""}
    if message.name is not None:
        rendered["name"] = message.name
    if message.tool_calls:
        if message.role != "assistant":
            raise bad_request("only assistant messages may carry tool_calls", param=f"{param}.tool_calls")
        rendered["tool_calls"] = [_tool_call(call, f"{param}.tool_calls[{i}]")
                                  for i, call in enumerate(message.tool_calls)]
    if message.role == "tool":
        if message.tool_call_id is None:
            raise bad_request(f"{param} (tool) needs the tool_call_id it answers", param=f"{param}.tool_call_id")
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def message_dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    if not messages:
        raise bad_request("messages must not be empty", param="messages")
    return [message_dict(message, index) for index, message in enumerate(messages)]


def num_chars(messages: list[dict[str, Any]]) -> int:
    """The characters of the messages' text (content and call arguments), for the cheap length check."""
    return sum(len(message["content"]) + sum(len(json.dumps(call["function"]["arguments"]))
                                             for call in message.get("tool_calls", ())) for message in messages)
