"""The detokenizer's logic without I/O: `TokenBatch` in, `TextBatch` out, per-request state inside.

Tokens are detokenized and checked for stop strings one at a time, so that a stop string completed
in the middle of a multi-token update ends the request at exactly the token that completed it; the
text ends right before the stop string, or right after it with `include_stop_str_in_output`.
The tokenizer is the raw `tokenizers.Tokenizer` (no transformers import), which keeps start-up fast.
A finished beam search arrives as one update carrying its beams; each is detokenized whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import msgspec
from tokenizers import Tokenizer

from rapid_llm.detokenizer_proc.incremental import IncrementalDetokenizer, StopStringMatcher
from rapid_llm.ipc.messages import DetokenizeRequest, TextBatch, TextDelta, TokenBatch, TokenUpdate

# Requests ended by a stop string stay remembered until the scheduler reports their end, so that
# their remaining tokens are dropped; the cap bounds memory should that report never come.
MAX_REMEMBERED_STOPPED = 65536


def load_tokenizer(tokenizer_dir: str) -> Tokenizer:
    """Load the checkpoint's fast tokenizer, from tokenizer.json when there is one."""
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if os.path.isfile(path):
        return Tokenizer.from_file(path)
    # Only checkpoints without tokenizer.json pay for transformers (and torch): it converts slow tokenizers.
    from transformers import AutoTokenizer

    backend = getattr(AutoTokenizer.from_pretrained(tokenizer_dir), "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{tokenizer_dir} has no tokenizer.json and its tokenizer has no fast (tokenizers) backend")
    return backend


class _RequestState:
    __slots__ = ("request", "stream", "stops", "min_tokens", "include_stop", "num_output_tokens")

    def __init__(self, tokenizer: Tokenizer, request: DetokenizeRequest) -> None:
        self.request = request
        self.stream = IncrementalDetokenizer(tokenizer, request.prompt_token_ids, request.skip_special_tokens)
        self.stops = StopStringMatcher(request.stop)
        self.min_tokens = request.min_tokens
        self.include_stop = request.include_stop_str_in_output
        self.num_output_tokens = 0


class Detokenizer:
    """Holds every live request's detokenization state; `process` maps one batch to its deltas."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._requests: dict[str, _RequestState] = {}
        self._stopped: dict[str, None] = {}  # insertion-ordered, so the oldest is dropped first

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    def process(self, batch: TokenBatch) -> TextBatch | None:
        """Register the batch's new requests, then turn its updates into deltas (None if there are none)."""
        for request in batch.new_requests:
            self._requests[request.request_id] = _RequestState(self._tokenizer, request)
            self._stopped.pop(request.request_id, None)
        deltas = [delta for update in batch.updates if (delta := self._update(update)) is not None]
        return TextBatch(deltas) if deltas else None

    def _update(self, update: TokenUpdate) -> TextDelta | None:
        request_id = update.request_id
        if request_id in self._stopped:
            # The frontend already has this request's final delta.
            if update.finish_reason is not None:
                del self._stopped[request_id]
            return None
        state = self._requests.get(request_id)
        if state is None:
            # Never registered (e.g. aborted before its first tokens): the frontend still needs the end.
            return _delta(update, "", len(update.token_ids), update.finish_reason, update.stop_reason)

        if update.beams:
            # A finished beam search: each beam is a whole text of its own (beam search takes no stop strings).
            del self._requests[request_id]
            beams = [msgspec.structs.replace(beam, text=self._beam_text(state.request, beam.token_ids))
                     for beam in update.beams]
            return msgspec.structs.replace(_delta(update, "", 0, update.finish_reason, update.stop_reason),
                                           beams=beams)
        finishing = update.finish_reason is not None
        pieces: list[str] = []
        for num_tokens, text in _new_texts(state.stream, update.token_ids, finishing):
            state.num_output_tokens += 1
            if state.num_output_tokens < state.min_tokens:
                # As in vLLM, stop strings count only once min_tokens are out; nothing is held back before.
                pieces.append(text)
                continue
            released, stop = state.stops.feed(text)
            pieces.append(released)
            if stop is not None:
                if state.include_stop:
                    pieces.append(stop)  # text after the stop string, within its token, is still cut
                del self._requests[request_id]
                if not finishing:
                    self._remember_stopped(request_id)
                return _delta(update, "".join(pieces), num_tokens, "stop", stop)
        if finishing:
            pieces.append(state.stops.flush())
            del self._requests[request_id]
        return _delta(update, "".join(pieces), len(update.token_ids), update.finish_reason, update.stop_reason)

    def _beam_text(self, request: DetokenizeRequest, token_ids: list[int]) -> str:
        stream = IncrementalDetokenizer(self._tokenizer, request.prompt_token_ids, request.skip_special_tokens)
        return "".join(text for _, text in _new_texts(stream, token_ids, finishing=True))

    def _remember_stopped(self, request_id: str) -> None:
        self._stopped[request_id] = None
        if len(self._stopped) > MAX_REMEMBERED_STOPPED:
            del self._stopped[next(iter(self._stopped))]


def _new_texts(stream: IncrementalDetokenizer, token_ids: list[int], finishing: bool) -> Iterator[tuple[int, str]]:
    """Yield (tokens consumed so far, new text) per token; a finishing update's held-back text comes last.

    A generator, so that tokens after a stop string are never decoded.
    """
    for index, token_id in enumerate(token_ids):
        text = stream.add(token_id)
        if finishing and index == len(token_ids) - 1:
            text += stream.finish()
        yield index + 1, text
    if finishing and not token_ids:
        yield 0, stream.finish()


def _delta(
    update: TokenUpdate, text: str, num_tokens: int, finish_reason: str | None, stop_reason: int | str | None
) -> TextDelta | None:
    """The delta for the update's first `num_tokens` tokens, or None if nothing happened."""
    token_ids = update.token_ids[:num_tokens]
    if (not text and not token_ids and finish_reason is None and not update.prompt_logprobs
            and not update.embedding):
        return None
    return TextDelta(
        request_id=update.request_id,
        text=text,
        token_ids=token_ids,
        logprobs=update.logprobs[:num_tokens],
        finish_reason=finish_reason,
        stop_reason=stop_reason,
        num_prompt_tokens=update.num_prompt_tokens,
        num_cached_tokens=update.num_cached_tokens,
        prompt_logprobs=update.prompt_logprobs,
        queue_time=update.queue_time,
        prefill_time=update.prefill_time,
        error=update.error,
        error_kind=update.error_kind,
        embedding=update.embedding,
        kv_transfer_params=update.kv_transfer_params,
    )
