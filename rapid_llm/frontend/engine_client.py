"""EngineClient: what the HTTP routes need from the engine, independent of how it is wired.

The routes depend only on this protocol; the ZeroMQ-backed implementation talks to the scheduler
and detokenizer processes, and tests substitute an in-process fake.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol

from rapid_llm.ipc.messages import SchedulerStats, TextDelta
from rapid_llm.sampling import SamplingParams


class EngineClient(Protocol):
    model_name: str  # the served model name (what clients put in "model")
    model_path: str  # the checkpoint directory (reported as "root")
    max_model_len: int
    vocab_size: int  # the model's vocab_size (embedding rows): prompt token ids must be below it
    tokenizer: Any  # a transformers PreTrainedTokenizerBase (encode, decode, apply_chat_template)
    enable_prefix_caching: bool  # whether responses report cached prompt tokens
    server_info: dict[str, Any]  # resolved engine settings, served at GET /server_info

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> AsyncIterator[TextDelta]:
        """Yield the request's deltas until one carries a finish_reason.

        Closing the iterator early (client gone) aborts the request in the scheduler.
        """

    async def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing flushed) while requests are running."""

    def stats(self) -> SchedulerStats | None:
        """The scheduler's latest counts (None before the first report)."""

    def is_healthy(self) -> bool:
        """False once any engine process has died, or while requests run and the engine reports no
        progress for longer than the watchdog timeout."""
