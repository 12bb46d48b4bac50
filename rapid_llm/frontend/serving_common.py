"""What the generation routes share: request checks, fan-out, responses.

Key design choice: a route only turns its body into prompt token ids and SamplingParams and
supplies a `ResponseFormat` (how one choice looks in its response and chunk objects); everything
else -- the context-length check, fanning `n` choices out to `n` engine requests, merging their
deltas, usage, disconnect handling and metrics -- happens here once. A beam search is one engine
request per prompt whose final delta carries its n best beams, expanded into choices here.
`Serving.generate` gives the chat- or completion-shaped result (a dict, or a `ChunkStream`);
`Serving.respond` sends it as OpenAI does, while /v1/responses and /v1/messages reshape it first.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator, Protocol, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.chat_template import ChatTemplate
from rapid_llm.frontend.engine_client import EngineClient
from rapid_llm.frontend.chunk_stream import ChunkStream, OpenAIEvents, stream_events
from rapid_llm.frontend.errors import OpenAIError, bad_request
from rapid_llm.frontend.metrics import FrontendMetrics
from rapid_llm.frontend.options import FrontendOptions
from rapid_llm.frontend.lora_adapters import LoRAAdapters
from rapid_llm.frontend.protocol import GenerationRequest, RequestT, decode_request
from rapid_llm.frontend.request_limits import check_json_depth, read_body
from rapid_llm.frontend.sse import CLIENT_CLOSED_REQUEST, EventStreamResponse, run_unless_disconnected
from rapid_llm.frontend.structured_request import check_structured_outputs
from rapid_llm.ipc.choice_output import ChoiceOutput, expand_beams
from rapid_llm.ipc.messages import TextDelta
from rapid_llm.sampling import ContextLengthError, SamplingParams, fit_max_tokens

logger = logging.getLogger(__name__)

T = TypeVar("T")

# JSON has no -inf; clients get the same floor vLLM uses.
MIN_LOGPROB = -9999.0


class ResponseFormat(Protocol):
    """How one route shapes its response objects; one instance per HTTP request."""

    id_prefix: str
    object_name: str
    chunk_object_name: str
    # Fields of the whole response beside the envelope and choices; a stream sends them with each choice's
    # opening chunk (vLLM's chat `prompt_token_ids`).
    response_fields: dict[str, Any]

    def choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        """A choice of the non-streaming response."""

    def chunk_choice(self, index: int, output: ChoiceOutput) -> dict[str, Any] | None:
        """A choice of one stream chunk (new text since the previous chunk); None: nothing to send yet."""

    def opening_chunk_choice(self, index: int) -> dict[str, Any] | None:
        """A chunk choice sent before a choice's first output, if the format has one."""


class TokenStrings:
    """The decoded text of single token ids (what vLLM reports in logprobs), cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id])
        return text


def clamp_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def json_response(payload: object) -> Response:
    return Response(msgspec.json.encode(payload), media_type="application/json")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    """The OpenAI usage object; `cached_tokens` None (no prefix cache) leaves out the details."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": None if cached_tokens is None else {"cached_tokens": cached_tokens},
    }


def _checked_decode(raw: bytes, request_type: type[RequestT]) -> RequestT:
    check_json_depth(raw)
    return decode_request(raw, request_type)


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token can stand for: every vocabulary entry's length bounds its text
    (a byte-level BPE entry holds one character per byte, never fewer characters than it decodes to)."""
    return max(map(len, tokenizer.get_vocab()), default=1)


class Serving:
    """Engine-facing work of the generation routes; one per app.

    Tokenization and chat-template rendering run in worker threads, so one large or slow request
    never holds up the event loop (health checks, other requests' streams).
    """

    def __init__(self, engine: EngineClient, metrics: FrontendMetrics, options: FrontendOptions,
                 adapters: LoRAAdapters | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self.options = options
        # What "model" may name: the served model, and its LoRA adapters when --enable-lora is on.
        self.adapters = adapters or LoRAAdapters(engine.model_name)
        self.token_strings = TokenStrings(engine.tokenizer)
        self.vocab_size = engine.vocab_size
        self.chat_template = ChatTemplate(engine.tokenizer, options.chat_template,
                                          options.trust_request_chat_template)
        # Text longer than this cannot fit max_model_len whatever it says, so it is refused untokenized.
        self.max_prompt_chars = engine.max_model_len * longest_token_chars(engine.tokenizer)

    def check_engine(self) -> None:
        if not self.engine.is_healthy():
            # A dead engine would never answer; fail fast instead of hanging the client.
            raise OpenAIError(503, "the engine is not running; see the server log")

    async def parse(self, request: Request, request_type: type[RequestT]) -> RequestT:
        """The body, decoded and checked; a "model" that is neither the served model nor an adapter is a 404."""
        body = await self.read(request, request_type)
        self.adapters.resolve(body.model)
        return body

    async def read(self, request: Request, request_type: type[T]) -> T:
        """The body decoded as `request_type` (a 400 naming the field when it does not fit)."""
        self.check_engine()
        raw = await read_body(request, self.options.max_request_body_bytes)
        # Measuring and decoding megabytes takes a while: a worker thread, off the event loop.
        return await asyncio.to_thread(_checked_decode, raw, request_type)

    def check_text_length(self, num_chars: int, param: str) -> None:
        """A cheap refusal before tokenizing: more characters than max_model_len tokens can cover."""
        if num_chars > self.max_prompt_chars:
            limit = self.engine.max_model_len
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, your request's {param} has "
                f"{num_chars} characters, more than {limit} tokens can hold. Please reduce the length of the "
                f"{param}.", param=param, code="context_length_exceeded")

    async def encode(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (tokenized in a worker thread), checked like any prompt."""
        self.check_text_length(len(text), param)
        token_ids = await asyncio.to_thread(self.engine.tokenizer.encode, text, add_special_tokens=add_special_tokens)
        self.check_prompt_ids(token_ids, param)
        return token_ids

    async def decode(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        """The text of `token_ids`, decoded in a worker thread (echoing a token-id prompt)."""
        return await asyncio.to_thread(self.engine.tokenizer.decode, token_ids,
                                       skip_special_tokens=skip_special_tokens)

    def check_vocab_params(self, params: SamplingParams) -> None:
        """Token ids and counts in the sampling params that only the vocabulary bounds."""
        if any(token_id >= self.vocab_size for token_id in params.stop_token_ids):
            raise bad_request(f"stop_token_ids has token ids outside the vocabulary [0, {self.vocab_size})",
                              param="stop_token_ids")
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            raise bad_request(f"logit_bias has token ids outside the vocabulary [0, {self.vocab_size})",
                              param="logit_bias")
        if params.top_k > self.vocab_size:
            raise bad_request(f"top_k must be at most the vocabulary size {self.vocab_size}, got {params.top_k}",
                              param="top_k")

    def check_prompt_ids(self, token_ids: list[int], param: str) -> None:
        if not token_ids:
            raise bad_request(f"{param} must not be empty", param=param)
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            raise bad_request(f"{param} has token ids outside the vocabulary [0, {self.vocab_size})", param=param)

    def resolve_max_tokens(self, num_prompt_tokens: int, requested: int | None, param: str, prompt_param: str) -> int:
        """`requested`, or when None the rest of the context capped by the checkpoint's max_new_tokens
        (--generation-config; vLLM takes the smaller); a 400 when it does not fit."""
        limit = self.engine.max_model_len
        try:
            max_tokens = fit_max_tokens(num_prompt_tokens, requested, limit)
        except ContextLengthError as error:
            if error.too_long == "empty":
                raise bad_request(f"{prompt_param} must not be empty", param=prompt_param) from None
            if error.too_long == "prompt":
                raise bad_request(
                    f"This model's maximum context length is {limit} tokens. However, your request has "
                    f"{num_prompt_tokens} input tokens. Please reduce the length of the {prompt_param}.",
                    param=prompt_param,
                    code="context_length_exceeded",
                ) from None
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the {prompt_param}, {requested} "
                f"in the completion). Please reduce the length of the {prompt_param} or completion.",
                param=param,
                code="context_length_exceeded",
            ) from None
        if requested is None and "max_tokens" in self.options.sampling_defaults:
            return min(max_tokens, self.options.sampling_defaults["max_tokens"])
        return max_tokens

    async def respond(
        self,
        request: Request,
        fmt: ResponseFormat,
        body: GenerationRequest,
        prompts: list[tuple[list[int], SamplingParams]],
        drop_output: bool = False,
    ) -> Response:
        """Generate every choice of every prompt (see `generate`) and send the result: a JSON body, or SSE
        chunks closed by `data: [DONE]`."""
        generated = await self.generate(request, fmt, body, prompts, drop_output)
        if generated is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        if isinstance(generated, ChunkStream):
            return EventStreamResponse(stream_events(generated, OpenAIEvents()), close=generated.close)
        return json_response(generated)

    async def generate(
        self,
        request: Request,
        fmt: ResponseFormat,
        body: GenerationRequest,
        prompts: list[tuple[list[int], SamplingParams]],
        drop_output: bool = False,
    ) -> dict[str, Any] | ChunkStream | None:
        """The whole response object, or (`body.stream`) its chunk objects as they are generated; None when
        the client disconnected first (the request is aborted). Choice index = prompt index * n + i (as
        vLLM). `drop_output`: the generated tokens are not part of the answer (echo with max_tokens 0).
        A refusal before the first output raises OpenAIError; after it, the chunk iterator raises."""
        for _, params in prompts:
            self.check_vocab_params(params)
        structured, structured_field = body.structured_outputs_params()
        if structured is not None:
            await asyncio.to_thread(check_structured_outputs, structured, structured_field)
        lora = self.adapters.resolve(body.model)
        envelope = {
            "id": f"{fmt.id_prefix}-{uuid.uuid4().hex}",
            "object": fmt.object_name,
            "created": int(time.time()),
            "model": self.engine.model_name if lora is None else lora.lora_name,
        }
        choices = [(prompt_ids, choice if lora is None else msgspec.structs.replace(choice, lora=lora))
                   for prompt_ids, params in prompts for choice in params.per_choice()]
        num_prompt_tokens = sum(len(prompt_ids) for prompt_ids, _ in prompts)
        n = len(choices) // len(prompts)
        if body.stream:
            envelope["object"] = fmt.chunk_object_name
            deltas = self._deltas(envelope["id"], choices, num_prompt_tokens, n, drop_output)
            # A refusal (bad parameters, a full queue) is the first delta: it gets its own status code
            # (and Retry-After) only if it comes before the stream's 200 headers.
            first = await run_unless_disconnected(anext(deltas), request.receive)
            if first is None:
                logger.info("%s: client disconnected, request aborted", envelope["id"])
                return None
            chunks = self._chunks(envelope, fmt, first, deltas, len(choices), num_prompt_tokens, n, body.include_usage)
            return ChunkStream(envelope["id"], chunks, deltas.aclose)
        outputs = await run_unless_disconnected(
            self._collect(envelope["id"], choices, num_prompt_tokens, n, drop_output), request.receive)
        if outputs is None:
            logger.info("%s: client disconnected, request aborted", envelope["id"])
            return None
        cached_tokens = self._cached_tokens([out.num_cached_tokens for out in outputs], n)
        # A beam search is one engine request per prompt: its n best beams become that prompt's choices.
        outputs = expand_beams(outputs)
        # Every generated token counts, also those of choices best_of leaves out (as OpenAI bills them).
        completion_tokens = sum(len(out.token_ids) for out in outputs)
        if body.ranks_choices:
            outputs = best_choices(outputs, n, body.n)
        response = {
            **envelope,
            "choices": [fmt.choice(i, out) for i, out in enumerate(outputs)],
            "usage": usage(num_prompt_tokens, completion_tokens, cached_tokens),
            **fmt.response_fields,
        }
        if body.kv_transfer_params is not None:
            # vLLM's: a prefill instance's answer names where its KV waits (one prompt, one choice).
            kept = outputs[0].kv_transfer_params
            response["kv_transfer_params"] = None if kept is None else msgspec.to_builtins(kept)
        return response

    def _cached_tokens(self, per_choice: list[int], n: int) -> int | None:
        """Cached prompt tokens for the usage object; None when the engine has no prefix cache."""
        if not self.engine.enable_prefix_caching:
            return None
        # A prompt's tokens count once for its n choices, so cached ones do too: those cached for all n.
        return sum(min(per_choice[start : start + n]) for start in range(0, len(per_choice), n))

    async def _collect(
        self, request_id: str, choices: list[tuple[list[int], SamplingParams]], num_prompt_tokens: int, n: int,
        drop_output: bool,
    ) -> list[ChoiceOutput]:
        outputs = [ChoiceOutput() for _ in choices]
        async with aclosing(self._deltas(request_id, choices, num_prompt_tokens, n, drop_output)) as deltas:
            async for index, delta in deltas:
                outputs[index].add(delta)
        return outputs

    async def _chunks(
        self,
        envelope: dict[str, Any],
        fmt: ResponseFormat,
        first: tuple[int, TextDelta],
        deltas: AsyncIterator[tuple[int, TextDelta]],
        num_choices: int,
        num_prompt_tokens: int,
        n: int,
        include_usage: bool,
    ) -> AsyncIterator[dict[str, Any]]:
        # A delta with neither tokens nor text nor an end (prompt logprobs ahead of the first token) waits here
        # for the next one. A token whose text the detokenizer holds back (an incomplete UTF-8 sequence) goes
        # out at once with empty text, as vLLM streams it, so a client sees every token when it is made.
        pending = [ChoiceOutput() for _ in range(num_choices)]
        opened = [False] * num_choices
        cached = [0] * num_choices
        completion_tokens = 0
        async with aclosing(deltas):
            async for index, delta in _prepend(first, deltas):
                completion_tokens += len(delta.token_ids)
                cached[index] = max(cached[index], delta.num_cached_tokens)
                output = pending[index]
                output.add(delta)
                if not delta.text and not delta.token_ids and delta.finish_reason is None:
                    continue
                if not opened[index]:
                    opened[index] = True
                    opening = fmt.opening_chunk_choice(index)
                    if opening is not None:
                        yield {**envelope, **fmt.response_fields, "choices": [opening]}
                choice = fmt.chunk_choice(index, output)
                if choice is not None:
                    yield {**envelope, "choices": [choice]}
                pending[index] = ChoiceOutput()
        if include_usage:
            total = usage(num_prompt_tokens, completion_tokens, self._cached_tokens(cached, n))
            yield {**envelope, "choices": [], "usage": total}

    async def _deltas(
        self, request_id: str, choices: list[tuple[list[int], SamplingParams]], num_prompt_tokens: int, n: int,
        drop_output: bool,
    ) -> AsyncIterator[tuple[int, TextDelta]]:
        """(choice index, delta) as they arrive, without their tokens if `drop_output` (the metrics still
        count them: they were generated); closing this aborts every unfinished choice."""
        tracker = self.metrics.track(num_prompt_tokens, len(choices), n)
        generators = [
            self.engine.generate(f"{request_id}-{i}", prompt_ids, params)
            for i, (prompt_ids, params) in enumerate(choices)
        ]
        try:
            async with aclosing(_merge(generators)) as merged:
                async for index, delta in merged:
                    tracker.observe(index, delta)
                    if drop_output:
                        delta = msgspec.structs.replace(delta, text="", token_ids=[], logprobs=[])
                    yield index, delta
        finally:
            for generator in generators:
                await generator.aclose()  # type: ignore[attr-defined]  # engine iterators are async generators
            tracker.close()


def cumulative_logprob(output: ChoiceOutput) -> float:
    return sum(entry.logprob for entry in output.logprobs if entry is not None)


def best_choices(outputs: list[ChoiceOutput], group: int, keep: int) -> list[ChoiceOutput]:
    """Of each prompt's `group` consecutive outputs, the `keep` of highest cumulative logprob, best
    first (vLLM's best_of)."""
    best = []
    for start in range(0, len(outputs), group):
        ranked = sorted(outputs[start:start + group], key=cumulative_logprob, reverse=True)
        best.extend(ranked[:keep])
    return best


async def _prepend(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """`first`, then the items of `rest` (which the caller closes)."""
    yield first
    async for item in rest:
        yield item


async def _merge(generators: list[AsyncIterator[TextDelta]]) -> AsyncIterator[tuple[int, TextDelta]]:
    """Interleave the generators' items in arrival order, tagged with the generator's index."""
    if len(generators) == 1:
        # The common case needs no tasks or queue.
        async for delta in generators[0]:
            yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, TextDelta | Exception | None]] = asyncio.Queue()

    async def pump(index: int, generator: AsyncIterator[TextDelta]) -> None:
        try:
            async for delta in generator:
                queue.put_nowait((index, delta))
            queue.put_nowait((index, None))
        except Exception as exc:
            queue.put_nowait((index, exc))

    tasks = [asyncio.create_task(pump(i, generator)) for i, generator in enumerate(generators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        # Cancelling a pump throws into its generator's pending step, which closes (aborts) it.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
