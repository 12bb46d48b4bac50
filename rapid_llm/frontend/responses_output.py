"""Chat completion results reshaped as OpenAI Responses objects: the whole `response`, or its event stream.

Key design choice: one `ResponseShape` per request builds the response object (the request's settings
echoed, output items, usage) for both paths; the stream (`ResponsesEvents`) keeps the output items it
has opened and closes one before opening the next, so each item's events run added -> deltas -> done
in `output_index` order: `reasoning` (a chat `reasoning_content`), `message` (content), then one
`function_call` item per tool call.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

import msgspec

from rapid_llm.frontend.chunk_stream import ItemEvents, named_event
from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.responses_protocol import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def responses_usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"]}


def item_status(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def _text_part(kind: str, text: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _text_item(kind: str, text: str, status: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [_text_part(kind, text)],
                "status": status}
    return {"type": "message", "id": new_id("msg"), "role": "assistant", "status": status,
            "content": [_text_part(kind, text)]}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": new_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def output_items(message: dict[str, Any], finish_reason: str | None) -> list[dict[str, Any]]:
    """The output items of a whole chat message."""
    status = item_status(finish_reason)
    items = []
    if message.get("reasoning_content"):
        items.append(_text_item("reasoning", message["reasoning_content"], status))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(_text_item("message", message.get("content") or "", status))
    items.extend(_call_item(call["id"], call["function"]["name"], call["function"]["arguments"], status)
                 for call in calls)
    return items


class ResponseShape:
    """The response object of one request, in any state."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.body = body

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 finish_reason: str | None = None, error: OpenAIError | None = None) -> dict[str, Any]:
        body = self.body
        text_format = body.text.format if body.text is not None and body.text.format is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": None if error is None else {"code": error.code or "server_error", "message": error.message},
            "incomplete_details": {"reason": "max_output_tokens"} if finish_reason == "length" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": self.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": {"effort": None, "summary": None},
            "store": body.store is not False, "temperature": body.temperature, "top_p": body.top_p,
            "text": {"format": _struct_dict(text_format) if text_format is not None else {"type": "text"}},
            "tool_choice": _tool_choice(body), "tools": [_struct_dict(tool) for tool in body.tools or []],
            "truncation": "disabled", "usage": responses_usage(usage), "user": body.user,
            "metadata": body.metadata or {},
        }

    def whole(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The finished response from a whole chat completion."""
        choice = completion["choices"][0]
        finish_reason = choice["finish_reason"]
        return self.response("incomplete" if finish_reason == "length" else "completed",
                             output_items(choice["message"], finish_reason), completion["usage"], finish_reason)


def _struct_dict(struct: Any) -> dict[str, Any]:
    return {name: value for name, value in msgspec.structs.asdict(struct).items() if value is not None}


def _tool_choice(body: ResponsesRequest) -> Any:
    if body.tool_choice is None:
        return "auto" if body.tools else "none"
    return body.tool_choice if isinstance(body.tool_choice, str) else _struct_dict(body.tool_choice)


class ResponsesEvents(ItemEvents):
    """A chat chunk stream as Responses events (an `EventFormat`); `on_done` gets the final response."""

    def __init__(self, shape: ResponseShape, on_done: Callable[[dict[str, Any]], None]) -> None:
        super().__init__()
        self.shape = shape
        self.on_done = on_done
        self.sequence_number = 0
        self.closing_status = "completed"  # of an item closed because the next one opens

    def _event(self, name: str, **fields: Any) -> bytes:
        payload = {"type": name, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return named_event(name, payload)

    def opening_events(self) -> list[bytes]:
        response = self.shape.response("in_progress", [])
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def text_item(self, kind: str) -> dict[str, Any]:
        return _text_item("reasoning" if kind == "reasoning" else "message", "", "in_progress")

    def call_item(self, call_id: str, name: str) -> dict[str, Any]:
        return _call_item(call_id, name, "", "in_progress")

    def _where(self, position: int) -> dict[str, Any]:
        return {"item_id": self.items[position]["id"], "output_index": position}

    def item_opened(self, position: int) -> list[bytes]:
        item = self.items[position]
        out = [self._event("response.output_item.added", output_index=position, item=item)]
        if item["type"] != "function_call":
            out.append(self._event("response.content_part.added", **self._where(position), content_index=0,
                                   part=_text_part(item["type"], "")))
        return out

    def text_delta(self, position: int, kind: str, text: str) -> list[bytes]:
        self.items[position]["content"][0]["text"] += text
        if kind == "reasoning":
            return [self._event("response.reasoning_text.delta", **self._where(position), content_index=0, delta=text)]
        return [self._event("response.output_text.delta", **self._where(position), content_index=0, delta=text,
                            logprobs=[])]

    def arguments_delta(self, position: int, arguments: str) -> list[bytes]:
        self.items[position]["arguments"] += arguments
        return [self._event("response.function_call_arguments.delta", **self._where(position), delta=arguments)]

    def item_closed(self, position: int) -> list[bytes]:
        item = self.items[position]
        item["status"] = self.closing_status
        where = self._where(position)
        if item["type"] == "function_call":
            out = [self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])]
        else:
            part = item["content"][0]
            reasoning = item["type"] == "reasoning"
            name = "response.reasoning_text.done" if reasoning else "response.output_text.done"
            extra = {} if reasoning else {"logprobs": []}
            out = [self._event(name, **where, content_index=0, text=part["text"], **extra),
                   self._event("response.content_part.done", **where, content_index=0, part=part)]
        return out + [self._event("response.output_item.done", output_index=position, item=item)]

    def finish(self) -> list[bytes]:
        out = self.start()
        if not self.items:  # nothing was generated: an empty message, as a whole response has
            out += self.text("text", "")
        status = self.closing_status = item_status(self.finish_reason)
        out += self.close_open()
        response = self.shape.response(status, self.items, self.usage, self.finish_reason)
        self.on_done(response)
        return out + [self._event(f"response.{status}", response=response)]

    def fail(self, error: OpenAIError) -> list[bytes]:
        self.closing_status = "incomplete"
        out = self.start() + self.close_open()
        response = self.shape.response("failed", self.items, self.usage, error=error)
        return out + [self._event("response.failed", response=response)]
