"""Per-request incremental detokenization and stop-string matching.

`IncrementalDetokenizer` decodes a small sliding window of tokens instead of the whole output: the
window starts at an already-emitted character boundary, so the decoder sees the same left context
(leading-space rules of sentencepiece-style decoders, bytes of a split character) as a full decode
would, while each step costs O(window) rather than O(output length). Text ending in an incomplete
UTF-8 character (a trailing U+FFFD) is held back until a later token completes it.

`StopStringMatcher` finds stop strings across token boundaries and holds back a trailing piece of
text while it could still grow into one.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"

# Prompt tokens decoded ahead of the output so that its first token gets the spacing it has in context.
NUM_CONTEXT_TOKENS = 5

# A partial character spans at most 3 bytes, so valid text ends on a character boundary within a few
# tokens. A longer run that still ends in U+FFFD is invalid bytes from the model: emitting them then
# keeps the window, and with it the per-step cost, bounded.
MAX_PENDING_TOKENS = 16


class IncrementalDetokenizer:
    """Turns one request's output tokens into text, one token at a time, without the prompt's text.

    The window holds `_read_offset` tokens whose text is fully emitted (context) followed by tokens
    whose text is only partly emitted; `_emitted` counts the window's characters already accounted for.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        context_text = self._decode(context)
        if context_text.endswith(REPLACEMENT_CHAR):
            # The prompt ends inside a character; its context would change how the output's first
            # bytes decode, and a full decode of the output alone sees them as invalid too.
            context, context_text = [], ""
        self._window = context
        self._read_offset = len(context)
        self._emitted = len(context_text)

    def add(self, token_id: int) -> str:
        """Append one token; return the text that is now final (possibly "")."""
        self._window.append(token_id)
        text = self._decode(self._window)
        if text.endswith(REPLACEMENT_CHAR) and len(self._window) - self._read_offset < MAX_PENDING_TOKENS:
            stable = text.rstrip(REPLACEMENT_CHAR)
            delta = stable[self._emitted :]
            self._emitted = max(self._emitted, len(stable))
            return delta
        delta = text[self._emitted :]
        # The window ends on a character boundary: restart it at the previous boundary so that it
        # keeps one step of left context and stays short.
        del self._window[: self._read_offset]
        self._read_offset = len(self._window)
        self._emitted = len(self._decode(self._window))
        return delta

    def finish(self) -> str:
        """Return whatever text is still held back, incomplete characters included."""
        text = self._decode(self._window)
        delta = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return delta

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)


class StopStringMatcher:
    """Cuts a text stream at the first stop string, holding back text that may start one.

    "First" means the stop string completed earliest in the text (ties: the one starting earliest),
    which is what a character-by-character stream would see, so the result does not depend on how
    the text was split into tokens.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        # An empty stop string would match before any text; duplicates add nothing.
        self._stop = [s for s in dict.fromkeys(stop) if s]
        self._max_held = max((len(s) for s in self._stop), default=1) - 1
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add new text; return (text safe to emit, the matched stop string or None).

        After a match the returned text ends right before the stop string; the caller stops feeding.
        """
        if not self._stop:
            return text, None
        buffer = self._held + text
        match = self._first_match(buffer, len(self._held))
        if match is not None:
            start, stop = match
            self._held = ""
            return buffer[:start], stop
        keep = self._partial_suffix_length(buffer)
        cut = len(buffer) - keep
        self._held = buffer[cut:]
        return buffer[:cut], None

    def flush(self) -> str:
        """Release the held-back text (the stream ended without completing a stop string)."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str, num_checked: int) -> tuple[int, str] | None:
        # The first `num_checked` characters held no complete stop string, so a match must end after them.
        best: tuple[int, int, str] | None = None
        for stop in self._stop:
            start = buffer.find(stop, max(0, num_checked - len(stop) + 1))
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        return None if best is None else (best[1], best[2])

    def _partial_suffix_length(self, buffer: str) -> int:
        for length in range(min(len(buffer), self._max_held), 0, -1):
            suffix = buffer[-length:]
            if any(len(stop) > length and stop.startswith(suffix) for stop in self._stop):
                return length
        return 0
