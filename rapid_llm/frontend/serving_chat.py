"""POST /v1/chat/completions: messages through the model's chat template, `chat.completion` objects out.

Key design choice: the template is rendered to text and then encoded without special tokens, since
the template already wrote them (encoding with them would add a second BOS). Streams open each
choice with a `{"role": "assistant", "content": ""}` chunk, as vLLM and OpenAI do. With tool calling
on (see tool_choice.py), each choice's text goes through its tool parser: a whole response gets
`message.tool_calls`, a stream `delta.tool_calls`, and a choice that called tools finishes with
"tool_calls" where it would have finished with "stop". vLLM's `return_token_ids` adds the response's
`prompt_token_ids` (in a stream: on each choice's opening chunk) and each choice's `token_ids` (in a stream:
the chunk's). With `--reasoning-parser` the think block is split off first (`message.reasoning_content`,
`delta.reasoning_content`); only the rest is content, and only content goes through the tool parser.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.chat_messages import message_dicts, num_chars
from rapid_llm.frontend.protocol import ChatCompletionRequest
from rapid_llm.frontend.reasoning_parsers import REASONING_PARSERS
from rapid_llm.frontend.reasoning_parsers.base import ReasoningParser
from rapid_llm.frontend.reasoning_parsers.stream import ReasoningStream
from rapid_llm.frontend.serving_common import Serving, TokenStrings, clamp_logprob
from rapid_llm.frontend.tool_choice import plan_tools
from rapid_llm.frontend.tool_parsers import ToolParser
from rapid_llm.frontend.tool_parsers.stream import ToolCallStreamer, limit_calls, tool_call_dict
from rapid_llm.ipc.choice_output import ChoiceOutput
from rapid_llm.sampling import SamplingParams


def _tool_finish_reason(finish_reason: str | None) -> str | None:
    return "tool_calls" if finish_reason == "stop" else finish_reason


class ChatFormat:
    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, token_strings: TokenStrings, logprobs: bool,
                 make_tool_parser: Callable[[], ToolParser] | None = None, parallel_tool_calls: bool = True,
                 prompt_token_ids: list[int] | None = None, reasoning_parser: ReasoningParser | None = None) -> None:
        """`make_tool_parser`: a fresh parser per choice when tool calls are parsed, else None;
        `prompt_token_ids`: the prompt's ids when the request asked for token ids (return_token_ids), else None;
        `reasoning_parser`: splits the think block off each choice's text (--reasoning-parser), else None."""
        self.token_strings = token_strings
        self.logprobs = logprobs
        self.make_tool_parser = make_tool_parser
        self.parallel_tool_calls = parallel_tool_calls
        self.return_token_ids = prompt_token_ids is not None
        self.response_fields: dict[str, Any] = {}
        if prompt_token_ids is not None:
            self.response_fields["prompt_token_ids"] = prompt_token_ids
        self.reasoning_parser = reasoning_parser
        self._streams: dict[int, ToolCallStreamer] = {}
        self._reasoning_streams: dict[int, ReasoningStream] = {}

    def choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        content = output.text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.reasoning_parser is not None:
            reasoning, content = self.reasoning_parser.split(output.text)
            # As vLLM: a reply that thought but answered nothing has null content.
            message = {"role": "assistant", "content": content if reasoning is None else content or None,
                       "reasoning_content": reasoning}
        finish_reason = output.finish_reason
        if self.make_tool_parser is not None:
            parser = self.make_tool_parser()
            result = limit_calls(parser.parse(content, final=True), self.parallel_tool_calls)
            if result.calls:
                message["content"] = result.content or None
                message["tool_calls"] = [tool_call_dict(parser.make_call_id(), call) for call in result.calls]
                finish_reason = _tool_finish_reason(finish_reason)
        return self._with_token_ids({
            "index": index,
            "message": message,
            "logprobs": self._logprobs(output),
            "finish_reason": finish_reason,
            "stop_reason": output.stop_reason,
        }, output)

    def chunk_choice(self, index: int, output: ChoiceOutput) -> dict[str, Any] | None:
        content = output.text
        finish_reason = output.finish_reason
        final = finish_reason is not None
        # The closing chunk of a choice whose last step produced no text carries an empty delta.
        delta: dict[str, Any] = {}
        if self.reasoning_parser is not None:
            reasoning_stream = self._reasoning_streams.get(index)
            if reasoning_stream is None:
                reasoning_stream = self._reasoning_streams[index] = self.reasoning_parser.stream()
            reasoning, content = reasoning_stream.feed(content, final)
            if reasoning:
                delta["reasoning_content"] = reasoning
        tool_calls: list[dict[str, Any]] = []
        if self.make_tool_parser is not None:
            stream = self._streams.get(index)
            if stream is None:
                stream = self._streams[index] = ToolCallStreamer(self.make_tool_parser(), self.parallel_tool_calls)
            content, tool_calls = stream.feed(content, final)
            if stream.called_tools:
                finish_reason = _tool_finish_reason(finish_reason)
        parsing = self.reasoning_parser is not None or self.make_tool_parser is not None
        if content or (output.token_ids and not parsing):
            delta["content"] = content  # "" for tokens whose text is held back (vLLM's chunk shape)
        if tool_calls:
            delta["tool_calls"] = tool_calls
        logprobs = self._logprobs(output)
        # Tokens whose text a parser holds back still go out when their logprobs or ids were asked for.
        reports_tokens = bool(output.token_ids) and (logprobs is not None or self.return_token_ids)
        if not delta and finish_reason is None and not reports_tokens:
            return None  # text a reasoning or tool parser holds back until it knows what it is
        return self._with_token_ids({
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": output.stop_reason,
        }, output)

    def _with_token_ids(self, choice: dict[str, Any], output: ChoiceOutput) -> dict[str, Any]:
        if self.return_token_ids:
            choice["token_ids"] = output.token_ids
        return choice

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


async def chat_prompt_text(serving: Serving, body: ChatCompletionRequest) -> str:
    """The request's messages (and tools) rendered by the chat template."""
    messages = message_dicts(body.messages)
    serving.check_text_length(num_chars(messages), "messages")
    return await asyncio.to_thread(serving.chat_template.render, messages, body.add_generation_prompt,
                                   body.template_kwargs, body.request_chat_template, body.tool_dicts)


def _reasoning_parser(serving: Serving, params: SamplingParams) -> ReasoningParser | None:
    """The --reasoning-parser family for a request with `params`, or None when the server has none."""
    name = serving.options.reasoning_parser
    if name is None:
        return None
    return REASONING_PARSERS.get(name)(constrained=params.structured_outputs is not None)


async def prepare_chat(serving: Serving, body: ChatCompletionRequest) -> tuple[ChatFormat, list[int], SamplingParams]:
    """The chat format, prompt ids and sampling parameters of `body`: the chat route's work before
    generation, shared with the routes that translate their own request shapes into a chat request."""
    plan = plan_tools(body, serving.options)
    prompt_ids = await serving.encode(await chat_prompt_text(serving, body), "messages", add_special_tokens=False)
    max_tokens = serving.resolve_max_tokens(len(prompt_ids), body.requested_max_tokens, body.max_tokens_param,
                                            "messages")
    params = plan.apply(body.sampling_params(max_tokens, serving.options.sampling_defaults))
    fmt = ChatFormat(serving.token_strings, bool(body.logprobs), plan.make_parser, body.parallel_tool_calls,
                     prompt_ids if body.return_token_ids else None, _reasoning_parser(serving, params))
    return fmt, prompt_ids, params


async def create_chat_completion(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, ChatCompletionRequest)
    fmt, prompt_ids, params = await prepare_chat(serving, body)
    return await serving.respond(request, fmt, body, [(prompt_ids, params)])
