"""Chat templates: which template renders a request, and rendering it within a time and size limit.

Key design choice: rendering goes through transformers' `apply_chat_template` (jinja2's immutable
sandbox, the exact prompt transformers would build) in a worker thread, and a trace function that is
active only in that thread while it renders stops the template's own code once its deadline passes:
jinja compiles templates to Python whose frames are named `<template>`, so every loop iteration of
a runaway template meets the check, while the tokenizer's and jinja's own frames are not traced.
Templates sent by a request are refused unless the server was started with
`--trust-request-chat-template` (vLLM's flag). Usage: `ChatTemplate(tokenizer, override, trust).render(...)`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable

import jinja2

from rapid_llm.frontend.errors import bad_request

RENDER_TIMEOUT_S = 2.0
MAX_RENDERED_CHARS = 16 * 2**20
_TEMPLATE_FILENAME = "<template>"
_TEMPLATE_HINTS = ("{", "}", "\n")

Tracer = Callable[[FrameType, str, Any], Any]


def load_chat_template(value: str) -> str:
    """`--chat-template`: a file's text, or the template itself when it is written inline (as vLLM)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if any(hint in value for hint in _TEMPLATE_HINTS):
        return value
    raise ValueError(f"--chat-template {value!r} is neither a readable file nor an inline jinja template")


class RenderTimeout(Exception):
    """Raised inside a template's own frames once its render deadline has passed."""


def _deadline_tracer(deadline: float) -> Tracer:
    def local(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line" and time.monotonic() > deadline:
            raise RenderTimeout
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        return local if frame.f_code.co_filename == _TEMPLATE_FILENAME else None

    return on_call


class ChatTemplate:
    def __init__(self, tokenizer: Any, override: str | None = None, trust_request_templates: bool = False) -> None:
        self.tokenizer = tokenizer
        self.override = override
        self.trust_request_templates = trust_request_templates

    def _template(self, request_template: str | None) -> str | None:
        if request_template is not None:
            if not self.trust_request_templates:
                raise bad_request("chat templates sent with a request are refused; the server must be started "
                                  "with --trust-request-chat-template to allow them", param="chat_template")
            return request_template
        if self.override is None and getattr(self.tokenizer, "chat_template", None) is None:
            raise bad_request("this model has no chat template; start the server with --chat-template FILE "
                              "(or use /v1/completions)", param="messages")
        return self.override

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               template_kwargs: dict[str, Any], request_template: str | None = None,
               tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text; a 400 when the template fails, runs past its time limit or renders too much.
        `tools` become the template's `tools` variable (as transformers passes them). Blocking: call it
        from a worker thread."""
        template = self._template(request_template)
        options = {**template_kwargs, "tokenize": False, "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            options["tools"] = tools
        sys.settrace(_deadline_tracer(time.monotonic() + RENDER_TIMEOUT_S))
        try:
            text = self.tokenizer.apply_chat_template(messages, chat_template=template, **options)
        except RenderTimeout:
            raise bad_request(f"the chat template did not finish rendering within {RENDER_TIMEOUT_S} s",
                              param="messages") from None
        except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError, AttributeError,
                RecursionError) as exc:
            raise bad_request(f"the chat template could not render these messages: {exc}",
                              param="messages") from None
        finally:
            sys.settrace(None)
        if not isinstance(text, str):
            raise bad_request("the chat template did not render to text", param="messages")
        if len(text) > MAX_RENDERED_CHARS:
            raise bad_request(f"the chat template rendered more than {MAX_RENDERED_CHARS} characters",
                              param="messages")
        return text
