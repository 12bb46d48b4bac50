"""POST /v1/completions: a prompt (text or token ids) or a batch of them in, `text_completion` objects out.

Key design choice: only the prompt handling and the completions shape of a choice live here
(logprobs in the legacy `tokens / token_logprobs / top_logprobs / text_offset` layout); the
generation itself is `Serving.respond`, shared with chat. `echo` puts the prompt (and with
`logprobs`, its tokens' logprobs, the first null) before the output; `echo` with `max_tokens: 0`
generates one token and drops it, as vLLM does, so only the prompt is scored. vLLM's
`prompt_logprobs` adds a choice's `prompt_logprobs` list ({token id: logprob, rank, decoded_token}), and its
`return_token_ids` a choice's `prompt_token_ids` (in a stream: with the choice's first chunk only) and
`token_ids` (the output's, or in a stream the chunk's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.protocol import CompletionRequest
from rapid_llm.frontend.serving_common import Serving, TokenStrings, clamp_logprob
from rapid_llm.ipc.choice_output import ChoiceOutput
from rapid_llm.ipc.messages import TokenLogprobs
from rapid_llm.sampling.params import MAX_N

# Each choice is its own engine request (and frontend task): one body of tiny prompts must not start millions.
MAX_CHOICES = 1024


@dataclass
class Prompt:
    text: str | None  # None for token-id prompts until echo needs it
    token_ids: list[int]


class CompletionFormat:
    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, token_strings: TokenStrings, logprobs: int | None, prompts: list[Prompt], n: int, *,
                 echo: bool, prompt_logprobs: int | None, return_token_ids: bool) -> None:
        """`prompts[i]` is the prompt of choices i * n .. i * n + n - 1 (its text is set when echoing)."""
        self.token_strings = token_strings
        self.logprobs = logprobs
        self.prompts = prompts
        self.n = n
        self.echo = echo
        self.prompt_logprobs = prompt_logprobs
        self.return_token_ids = return_token_ids
        self.response_fields: dict[str, Any] = {}
        # text_offset runs on across a choice's stream chunks; a choice's prompt (echo, ids) comes with its first.
        self._offsets: dict[int, int] = {}
        self._started: set[int] = set()

    def choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        prompt = self.prompts[index // self.n]
        first = index not in self._started
        self._started.add(index)
        echo = prompt if self.echo and first else None
        choice = {
            "index": index,
            "text": output.text if echo is None else f"{echo.text}{output.text}",
            "logprobs": self._logprobs(index, output, echo) if self.logprobs is not None else None,
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
        }
        if self.prompt_logprobs is not None and output.prompt_logprobs:
            choice["prompt_logprobs"] = self._vllm_prompt_logprobs(prompt.token_ids, output.prompt_logprobs)
        if self.return_token_ids:
            if first:
                choice["prompt_token_ids"] = prompt.token_ids
            choice["token_ids"] = output.token_ids
        return choice

    chunk_choice = choice

    def opening_chunk_choice(self, index: int) -> None:
        return None

    def _logprobs(self, index: int, output: ChoiceOutput, echo: Prompt | None) -> dict[str, list[Any]]:
        layout: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = self._offsets.get(index, 0)
        if echo is not None:
            # The first prompt token has no logprob; the rest arrive with the choice's first output.
            self._add_entries(layout, zip(echo.token_ids, [None, *output.prompt_logprobs]), offset)
            # The output's offsets count from the end of the echoed text, not of its tokens' strings.
            offset += len(echo.text or "")
        self._offsets[index] = self._add_entries(layout, zip(output.token_ids, output.logprobs), offset)
        return layout

    def _add_entries(self, layout: dict[str, list[Any]], entries: Iterable[tuple[int, TokenLogprobs | None]],
                     offset: int) -> int:
        """Append tokens to the legacy layout from text offset `offset`; returns the offset after them."""
        for token_id, entry in entries:
            token = self.token_strings(token_id)
            layout["tokens"].append(token)
            layout["text_offset"].append(offset)
            offset += len(token)
            if entry is None:
                layout["token_logprobs"].append(None)
                layout["top_logprobs"].append(None)
                continue
            layout["token_logprobs"].append(clamp_logprob(entry.logprob))
            # Like vLLM, the chosen token is always listed, alongside the requested top ones.
            top = {token: clamp_logprob(entry.logprob)}
            for top_id, top_logprob in list(zip(entry.top_token_ids, entry.top_logprobs))[: self.logprobs]:
                top.setdefault(self.token_strings(top_id), clamp_logprob(top_logprob))
            layout["top_logprobs"].append(top)
        return offset

    def _vllm_prompt_logprobs(self, prompt_ids: list[int],
                              entries: list[TokenLogprobs]) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's layout: null for the first prompt token, then {token id: logprob, rank, decoded_token}."""
        listed: list[dict[str, dict[str, Any]] | None] = [None]
        # Entry i scores prompt token i + 1, whose id only the prompt holds.
        for token_id, entry in zip(prompt_ids[1:], entries):
            scored = {str(token_id): self._logprob_object(entry.logprob, entry.rank, token_id)}
            for rank, (top_id, top_logprob) in enumerate(zip(entry.top_token_ids[: self.prompt_logprobs],
                                                             entry.top_logprobs), start=1):
                scored.setdefault(str(top_id), self._logprob_object(top_logprob, rank, top_id))
            listed.append(scored)
        return listed

    def _logprob_object(self, logprob: float, rank: int | None, token_id: int) -> dict[str, Any]:
        return {"logprob": clamp_logprob(logprob), "rank": rank, "decoded_token": self.token_strings(token_id)}


async def prompt_inputs(serving: Serving, prompt: str | list[int | str | list[int]], n: int,
                        param: str = "prompt") -> list[Prompt]:
    """One prompt (text or token ids) or a batch of them (texts or token-id lists), tokenized; the
    batch size times `n` is checked before anything is tokenized. `param`: the request field holding them."""
    if isinstance(prompt, str) or (prompt and all(isinstance(item, int) for item in prompt)):
        items: list[str | list[int]] = [prompt]  # type: ignore[list-item]  # one prompt
    elif prompt and all(isinstance(item, (str, list)) for item in prompt):
        items = prompt  # type: ignore[assignment]  # a batch: strings or token-id lists
    else:
        raise bad_request(f"{param} must be a string, a list of token ids, or a list of either", param=param)
    # An n beyond MAX_N is refused (naming n) by the sampling-params check that follows.
    if len(items) * min(n, MAX_N) > MAX_CHOICES:
        raise bad_request(f"a request may ask for at most {MAX_CHOICES} choices (prompts x n), got "
                          f"{len(items)} x {n}", param=param)
    prompts = []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise bad_request(f"{param} must not be empty", param=param)
            prompts.append(Prompt(item, await serving.encode(item, param)))
        else:  # msgspec has checked that a nested list holds integers only
            serving.check_prompt_ids(item, param)
            prompts.append(Prompt(None, item))
    return prompts


async def create_completion(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, CompletionRequest)
    prompts = await prompt_inputs(serving, body.prompt, max(body.n, body.best_of or 0))
    if len(prompts) > 1 and body.kv_transfer_params is not None:
        # The answer names one lease: a prefill instance keeps one prompt's KV per request.
        raise bad_request("kv_transfer_params takes one prompt per request, got a batch of "
                          f"{len(prompts)}", param="kv_transfer_params")
    # Scoring a prompt alone still samples one token (which is dropped): the engine's steps end in a sample.
    requested_max_tokens = 1 if body.echo_only else body.max_tokens
    engine_prompts = []
    for prompt in prompts:
        max_tokens = serving.resolve_max_tokens(len(prompt.token_ids), requested_max_tokens, "max_tokens", "prompt")
        params = body.sampling_params(max_tokens, serving.options.sampling_defaults)
        engine_prompts.append((prompt.token_ids, params))
        if body.echo and prompt.text is None:
            prompt.text = await serving.decode(prompt.token_ids, params.skip_special_tokens)
    fmt = CompletionFormat(serving.token_strings, body.logprobs, prompts, body.n, echo=body.echo,
                           prompt_logprobs=body.prompt_logprobs, return_token_ids=body.return_token_ids)
    return await serving.respond(request, fmt, body, engine_prompts, drop_output=body.echo_only)
