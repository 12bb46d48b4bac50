"""POST /v1/chat/completions: messages through the model's chat template, `chat.completion` objects out.

Key design choice: the template is rendered to text and then encoded without special tokens, since
the template already wrote them (encoding with them would add a second BOS). Streams open each
choice with a `{"role": "assistant", "content": ""}` chunk, as vLLM and OpenAI do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.protocol import ChatCompletionRequest, ChatMessage
from rapid_llm.frontend.serving_common import Serving, TokenStrings, clamp_logprob
from rapid_llm.ipc.choice_output import ChoiceOutput


class ChatFormat:
    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, token_strings: TokenStrings, logprobs: bool) -> None:
        self.token_strings = token_strings
        self.logprobs = logprobs

    def choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        return {
            "index": index,
            "message": {"role": "assistant", "content": output.text},
            "logprobs": self._logprobs(output),
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
        }

    def chunk_choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        text = output.text
        return {
            "index": index,
            # The closing chunk of a choice whose last step produced no text carries an empty delta.
            "delta": {"content": text} if text else {},
            "logprobs": self._logprobs(output),
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
        }

    def opening_chunk_choice(self, index: int) -> dict[str, Any]:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def _logprobs(self, output: ChoiceOutput) -> dict[str, list[dict[str, Any]]] | None:
        if not self.logprobs:
            return None
        content = []
        for token_id, entry in zip(output.token_ids, output.logprobs):
            if entry is None:
                # The engine had no logprobs for this token; keep the list aligned with the text.
                content.append({**self._token_logprob(token_id, None), "top_logprobs": []})
                continue
            top = [self._token_logprob(t, lp) for t, lp in zip(entry.top_token_ids, entry.top_logprobs)]
            content.append({**self._token_logprob(token_id, entry.logprob), "top_logprobs": top})
        return {"content": content}

    def _token_logprob(self, token_id: int, logprob: float | None) -> dict[str, Any]:
        token = self.token_strings(token_id)
        return {
            "token": token,
            "logprob": None if logprob is None else clamp_logprob(logprob),
            "bytes": list(token.encode("utf-8")),
        }


def _message_dict(message: ChatMessage) -> dict[str, str]:
    """The plain dict chat templates expect; text parts are joined with newlines like vLLM does."""
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise bad_request("only text content parts are supported", param="messages")
        content = "\n".join(part.text for part in content if part.text is not None)
    rendered = {"role": message.role, "content": content or ""}
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


async def _prompt_token_ids(serving: Serving, body: ChatCompletionRequest) -> list[int]:
    if not body.messages:
        raise bad_request("messages must not be empty", param="messages")
    messages = [_message_dict(message) for message in body.messages]
    serving.check_text_length(sum(len(message["content"]) for message in messages), "messages")
    text = await asyncio.to_thread(serving.chat_template.render, messages, body.add_generation_prompt,
                                   body.template_kwargs, body.request_chat_template)
    return await serving.encode(text, "messages", add_special_tokens=False)


async def create_chat_completion(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, ChatCompletionRequest)
    prompt_ids = await _prompt_token_ids(serving, body)
    max_tokens = serving.resolve_max_tokens(len(prompt_ids), body.requested_max_tokens, body.max_tokens_param,
                                            "messages")
    params = body.sampling_params(max_tokens, serving.options.sampling_defaults)
    fmt = ChatFormat(serving.token_strings, params.logprobs is not None)
    return await serving.respond(request, fmt, body, [(prompt_ids, params)])
