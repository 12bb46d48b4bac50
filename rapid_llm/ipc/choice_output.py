"""ChoiceOutput: one request's output, accumulated from the TextDelta messages the detokenizer sends.

Both clients of the detokenizer use it: the HTTP frontend (a whole response, or what one stream
chunk carries) and the offline `LLM` (whose `CompletionOutput` extends it). Text is kept as parts
and joined on read, so appending a delta never copies what came before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rapid_llm.ipc.messages import BeamSequence, TextDelta, TokenLogprobs
from rapid_llm.sampling.kv_transfer_params import KVTransferParams


@dataclass
class ChoiceOutput:
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)  # aligned with token_ids
    # Prompt tokens from the second on, when prompt_logprobs was asked (the first has nothing to predict it).
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # why the engine aborted the request (finish_reason "abort"), if it did
    beams: list[BeamSequence] = field(default_factory=list)  # a finished beam search's n best, best first
    embedding: list[float] = field(default_factory=list)  # a pooling request's pooled prompt
    kv_transfer_params: KVTransferParams | None = None  # where a decode instance reads the prompt's KV

    @classmethod
    def from_beam(cls, beam: BeamSequence, num_cached_tokens: int) -> "ChoiceOutput":
        """One returned beam of a beam search as a choice."""
        return cls([beam.text], beam.token_ids, [None] * len(beam.token_ids), finish_reason=beam.finish_reason,
                   stop_reason=beam.stop_reason, num_cached_tokens=num_cached_tokens)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def add(self, delta: TextDelta) -> None:
        if delta.text:
            self.text_parts.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.prompt_logprobs.extend(delta.prompt_logprobs)
        if delta.embedding:
            self.embedding = delta.embedding
        if len(self.logprobs) < len(self.token_ids):
            self.logprobs.extend([None] * (len(self.token_ids) - len(self.logprobs)))
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason
            self.error = delta.error
            self.beams = delta.beams
            self.kv_transfer_params = delta.kv_transfer_params
        # Engines may report the count on any delta; the largest is the final one.
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)


def expand_beams(outputs: list[ChoiceOutput]) -> list[ChoiceOutput]:
    """Each finished beam search's beams as choices of their own, in place of its one output (other outputs,
    and an aborted search, stay as they are)."""
    expanded = []
    for output in outputs:
        if not output.beams:
            expanded.append(output)
            continue
        expanded.extend(ChoiceOutput.from_beam(beam, output.num_cached_tokens) for beam in output.beams)
    return expanded
