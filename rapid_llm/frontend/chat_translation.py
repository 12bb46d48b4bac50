"""What the routes that translate another API's request into a chat request share (/v1/responses,
/v1/messages): generating it through the chat pipeline, and naming the caller's own fields in errors.

Key design choice: each translated chat message remembers the field it came from (`sources`), so an
error the chat checks raise about `messages[4]` names `input[3]` or `messages[2].content[1]` instead;
other chat field names are mapped by the route's `renames`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from rapid_llm.frontend.chunk_stream import ChunkStream
from rapid_llm.frontend.errors import OpenAIError
from rapid_llm.frontend.protocol import ChatCompletionRequest
from rapid_llm.frontend.serving_chat import prepare_chat
from rapid_llm.frontend.serving_common import Serving


def original_param(param: str | None, sources: list[str], renames: dict[str, str]) -> str | None:
    """The caller's field behind a chat request's error `param`."""
    if param is not None and param.startswith("messages["):
        return sources[int(param[len("messages["):param.index("]")])]
    return None if param is None else renames.get(param, param)


async def generate_translated(serving: Serving, request: Request, chat: ChatCompletionRequest, sources: list[str],
                              renames: dict[str, str]) -> tuple[dict[str, Any] | ChunkStream | None, int]:
    """`Serving.generate`'s result for `chat` (None: the client left) and the prompt's token count."""
    try:
        fmt, prompt_ids, params = await prepare_chat(serving, chat)
        return await serving.generate(request, fmt, chat, [(prompt_ids, params)]), len(prompt_ids)
    except OpenAIError as error:
        error.param = original_param(error.param, sources, renames)
        raise
