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

from rapid_llm.frontend.chunk_stream import named_event
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


class ResponsesEvents:
    """A chat chunk stream as Responses events (an `EventFormat`); `on_done` gets the final response."""

    def __init__(self, shape: ResponseShape, on_done: Callable[[dict[str, Any]], None]) -> None:
        self.shape = shape
        self.on_done = on_done
        self.sequence_number = 0
        self.items: list[dict[str, Any]] = []
        self.open: str | int | None = None  # "reasoning", "message", or the chat index of an open tool call
        self.call_items: dict[int, int] = {}  # chat tool-call index -> output index
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None

    def _event(self, name: str, **fields: Any) -> bytes:
        payload = {"type": name, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return named_event(name, payload)

    def _start(self) -> list[bytes]:
        if self.sequence_number:
            return []
        response = self.shape.response("in_progress", [])
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def events(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                out += self._text("reasoning", delta["reasoning_content"])
            if delta.get("content"):
                out += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or []:
                out += self._call(call)
            self.finish_reason = choice["finish_reason"] or self.finish_reason
        return out

    def _open_item(self, item: dict[str, Any], key: str | int) -> list[bytes]:
        out = self._close("completed")
        self.open = key
        self.items.append(item)
        out.append(self._event("response.output_item.added", output_index=len(self.items) - 1, item=item))
        return out

    def _text(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != kind:
            item = _text_item(kind, "", "in_progress")
            out += self._open_item(item, kind)
            out.append(self._event("response.content_part.added", **self._where(), part=_text_part(kind, "")))
        if not text:
            return out
        self.items[-1]["content"][0]["text"] += text
        if kind == "reasoning":
            out.append(self._event("response.reasoning_text.delta", **self._where(), delta=text))
        else:
            out.append(self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[]))
        return out

    def _call(self, entry: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        function = entry.get("function") or {}
        if "id" in entry:  # a call's opening entry
            item = _call_item(entry["id"], function["name"], "", "in_progress")
            out += self._open_item(item, entry["index"])
            self.call_items[entry["index"]] = len(self.items) - 1
        arguments = function.get("arguments") or ""
        if arguments:
            output_index = self.call_items[entry["index"]]
            self.items[output_index]["arguments"] += arguments
            out.append(self._event("response.function_call_arguments.delta", item_id=self.items[output_index]["id"],
                                   output_index=output_index, delta=arguments))
        return out

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _close(self, status: str) -> list[bytes]:
        """The done events of the open item, if any."""
        if self.open is None:
            return []
        item = self.items[-1]
        item["status"] = status
        out = []
        if item["type"] == "function_call":
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=len(self.items) - 1, arguments=item["arguments"]))
        else:
            part = item["content"][0]
            name = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            extra = {} if item["type"] == "reasoning" else {"logprobs": []}
            out.append(self._event(name, **self._where(), text=part["text"], **extra))
            out.append(self._event("response.content_part.done", **self._where(), part=part))
        out.append(self._event("response.output_item.done", output_index=len(self.items) - 1, item=item))
        self.open = None
        return out

    def finish(self) -> list[bytes]:
        out = self._start()
        if not self.items:  # nothing was generated: an empty message, as a whole response has
            out += self._text("message", "")
        out += self._close(item_status(self.finish_reason))
        status = item_status(self.finish_reason)
        response = self.shape.response(status, self.items, self.usage, self.finish_reason)
        self.on_done(response)
        out.append(self._event(f"response.{status}", response=response))
        return out

    def fail(self, error: OpenAIError) -> list[bytes]:
        out = self._start() + self._close("incomplete")
        response = self.shape.response("failed", self.items, self.usage, error=error)
        out.append(self._event("response.failed", response=response))
        return out
