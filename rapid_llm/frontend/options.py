"""FrontendOptions: the HTTP server's own settings, resolved once by the launcher.

Kept apart from the engine's config: they change what the frontend accepts (API key, body size,
chat templates), never what the engine computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rapid_llm.frontend.request_limits import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class FrontendOptions:
    api_key: str | None = None  # required as `Authorization: Bearer KEY` on /v1/*, /flush_cache, /server_info
    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    chat_template: str | None = None  # the template text that replaces the tokenizer's (--chat-template)
    trust_request_chat_template: bool = False  # honour templates sent with a request
    tool_call_parser: str | None = None  # the family parser of tool_choice "auto" (--tool-call-parser)
    enable_auto_tool_choice: bool = False  # allow tool_choice "auto" (--enable-auto-tool-choice)
    reasoning_parser: str | None = None  # splits think blocks into reasoning_content (--reasoning-parser)
    # SamplingParams defaults for fields a request leaves unset (--generation-config)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
