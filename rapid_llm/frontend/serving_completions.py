"""POST /v1/completions: a prompt (text or token ids) or a batch of them in, `text_completion` objects out.

Key design choice: only the prompt handling and the completions shape of a choice live here
(logprobs in the legacy `tokens / token_logprobs / top_logprobs / text_offset` layout); the
generation itself is `Serving.respond`, shared with chat.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.protocol import CompletionRequest
from rapid_llm.frontend.serving_common import Serving, TokenStrings, clamp_logprob
from rapid_llm.ipc.choice_output import ChoiceOutput
from rapid_llm.sampling.params import MAX_N

# Each choice is its own engine request (and frontend task): one body of tiny prompts must not start millions.
MAX_CHOICES = 1024


class CompletionFormat:
    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, token_strings: TokenStrings, logprobs: bool) -> None:
        self.token_strings = token_strings
        self.logprobs = logprobs
        # text_offset runs on across a choice's stream chunks.
        self._offsets: dict[int, int] = {}

    def choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        return {
            "index": index,
            "text": output.text,
            "logprobs": self._logprobs(index, output) if self.logprobs else None,
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
        }

    chunk_choice = choice

    def opening_chunk_choice(self, index: int) -> None:
        return None

    def _logprobs(self, index: int, output: ChoiceOutput) -> dict[str, list[Any]]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        offset = self._offsets.get(index, 0)
        for token_id, entry in zip(output.token_ids, output.logprobs):
            token = self.token_strings(token_id)
            tokens.append(token)
            text_offset.append(offset)
            offset += len(token)
            if entry is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(clamp_logprob(entry.logprob))
            # Like vLLM, the sampled token is always listed, alongside the requested top ones.
            top = {token: clamp_logprob(entry.logprob)}
            for top_id, top_logprob in zip(entry.top_token_ids, entry.top_logprobs):
                top.setdefault(self.token_strings(top_id), clamp_logprob(top_logprob))
            top_logprobs.append(top)
        self._offsets[index] = offset
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        }


async def _prompts_token_ids(serving: Serving, prompt: str | list[int | str | list[int]], n: int) -> list[list[int]]:
    """One prompt (text or token ids) or a batch of them (texts or token-id lists), as token ids; the
    batch size times `n` is checked before anything is tokenized."""
    if isinstance(prompt, str) or (prompt and all(isinstance(item, int) for item in prompt)):
        prompts: list[str | list[int]] = [prompt]  # type: ignore[list-item]  # one prompt
    elif prompt and all(isinstance(item, (str, list)) for item in prompt):
        prompts = prompt  # type: ignore[assignment]  # a batch: strings or token-id lists
    else:
        raise bad_request("prompt must be a string, a list of token ids, or a list of either", param="prompt")
    # An n beyond MAX_N is refused (naming n) by the sampling-params check that follows.
    if len(prompts) * min(n, MAX_N) > MAX_CHOICES:
        raise bad_request(f"a request may ask for at most {MAX_CHOICES} choices (prompts x n), got "
                          f"{len(prompts)} x {n}", param="prompt")
    token_id_lists = []
    for item in prompts:
        if isinstance(item, str):
            if not item:
                raise bad_request("prompt must not be empty", param="prompt")
            token_id_lists.append(await serving.encode(item, "prompt"))
        else:  # msgspec has checked that a nested list holds integers only
            serving.check_prompt_ids(item, "prompt")
            token_id_lists.append(item)
    return token_id_lists


async def create_completion(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, CompletionRequest)
    if body.echo:
        raise bad_request("echo is not supported", param="echo")
    prompts = []
    for prompt_ids in await _prompts_token_ids(serving, body.prompt, body.n):
        max_tokens = serving.resolve_max_tokens(len(prompt_ids), body.max_tokens, "max_tokens", "prompt")
        prompts.append((prompt_ids, body.sampling_params(max_tokens, serving.options.sampling_defaults)))
    fmt = CompletionFormat(serving.token_strings, prompts[0][1].logprobs is not None)
    return await serving.respond(request, fmt, body, prompts)
