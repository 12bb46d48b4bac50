"""An in-process EngineClient for frontend tests: deterministic deltas, recorded requests and aborts.

Each request "generates" one of a few fixed sentences (picked by seed, so n>1 choices with seeds
differ) followed by EOS, a few tokens per delta, honouring max_tokens (finish "length"), ignore_eos
and logprobs; the first delta carries `queue_time` and `prefill_time` when they are set. Stop
strings are the detokenizer's job and are not applied here. A cache flush succeeds only while no
request is generating, as in the scheduler. `engine_error` ends every request as the real client
does for a delta carrying an engine error.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from rapid_llm.frontend.errors import engine_error
from rapid_llm.ipc.messages import ErrorKind, SchedulerStats, TextDelta, TokenLogprobs
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.tiny_checkpoint import EOS_TOKEN_ID

REPLIES = (
    "The capital of France is Paris.",
    "There are seven days in a week.",
    "The sea is wide and deep and blue.",
)


class FakeEngine:
    def __init__(
        self,
        tokenizer: Any,
        model_name: str = "tiny",
        model_path: str = "/models/tiny",
        max_model_len: int = 128,
        tokens_per_delta: int = 3,
        vocab_size: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_path = model_path
        self.max_model_len = max_model_len
        # Checkpoints often pad the embedding past the tokenizer; None: exactly the tokenizer's size.
        self.vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        self.tokens_per_delta = tokens_per_delta
        self.enable_prefix_caching = True
        self.server_info = {"model": model_path, "max_model_len": max_model_len}
        self.requests: list[tuple[str, list[int], SamplingParams]] = []
        self.running: set[str] = set()
        self.num_flushes = 0
        self.closed_early: list[str] = []  # generators closed before their finishing delta (aborted)
        self.healthy = True
        self.scheduler_stats: SchedulerStats | None = None
        self.num_cached_tokens = 0
        self.queue_time: float | None = None  # the scheduler's timings, put on each request's first delta
        self.prefill_time: float | None = None
        self.hold_after: int | None = None  # block forever after this many deltas (client-disconnect tests)
        self.fail_after: int | None = None  # raise after this many deltas (engine-failure tests)
        self.engine_error: tuple[ErrorKind, str] | None = None  # (kind, text) the engine ends requests with
        # The first deltas' text comes with the next delta, as the detokenizer holds back an incomplete character.
        self.text_held_deltas = 0

    def reply_token_ids(self, params: SamplingParams) -> list[int]:
        reply = self.tokenizer.encode(REPLIES[(params.seed or 0) % len(REPLIES)]) + [EOS_TOKEN_ID]
        if params.ignore_eos:
            reply = reply[:-1] * (1 + (params.max_tokens or 0) // max(len(reply) - 1, 1))
        return reply[: params.max_tokens]

    def _logprobs(self, token_ids: list[int], params: SamplingParams, start: int) -> list[TokenLogprobs | None]:
        if params.logprobs is None:
            return []
        vocab = len(self.tokenizer)
        return [
            TokenLogprobs(
                logprob=-0.125 * (start + i + 1),
                # The sampled token is the most likely one here, then its neighbours in the vocabulary.
                top_token_ids=[(token + k) % vocab for k in range(params.logprobs)],
                top_logprobs=[-0.125 * (start + i + 1) - k for k in range(params.logprobs)],
            )
            for i, token in enumerate(token_ids)
        ]

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TextDelta]:
        self.requests.append((request_id, prompt_token_ids, params))
        self.running.add(request_id)
        token_ids = self.reply_token_ids(params)
        if self.engine_error is not None:
            self.running.discard(request_id)
            raise engine_error(request_id, *self.engine_error)
        finished = False
        held = ""
        try:
            for count, start in enumerate(range(0, len(token_ids), self.tokens_per_delta)):
                if count == self.hold_after:
                    await asyncio.Event().wait()
                if count == self.fail_after:
                    raise RuntimeError("the fake engine failed")
                await asyncio.sleep(0)  # let other requests interleave, like a real engine step
                chunk = token_ids[start : start + self.tokens_per_delta]
                last = start + len(chunk) == len(token_ids)
                finish_reason = None
                if last:
                    finish_reason = "stop" if chunk[-1] == EOS_TOKEN_ID and not params.ignore_eos else "length"
                finished = last
                text = held + self.tokenizer.decode(chunk, skip_special_tokens=params.skip_special_tokens)
                held, text = (text, "") if count < self.text_held_deltas and not last else ("", text)
                yield TextDelta(
                    request_id=request_id,
                    text=text,
                    token_ids=chunk,
                    logprobs=self._logprobs(chunk, params, start),
                    finish_reason=finish_reason,
                    num_prompt_tokens=len(prompt_token_ids),
                    num_cached_tokens=self.num_cached_tokens,
                    queue_time=self.queue_time if count == 0 else None,
                    prefill_time=self.prefill_time if count == 0 else None,
                )
        finally:
            self.running.discard(request_id)
            if not finished:
                self.closed_early.append(request_id)

    async def flush_cache(self) -> bool:
        if self.running:
            return False
        self.num_flushes += 1
        return True

    def stats(self) -> SchedulerStats | None:
        return self.scheduler_stats

    def is_healthy(self) -> bool:
        return self.healthy
