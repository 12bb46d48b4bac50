"""MicroBatchConfig: two-batch overlap (`--enable-two-batch-overlap`, vLLM's `--enable-dbo`) and which steps split.

A step splits into two micro-batches only when it has at least `decode_token_threshold` tokens (a step of decodes
only) or `prefill_token_threshold` tokens (any other step): below that, half a batch reads the same weights for half
the work and runs the model's fixed per-forward costs twice, which costs more than the overlap hides (vLLM's flag
names; the defaults are measured, benchmarks/bench_overlap.py, docs/parallelism.md: on 2 CPU cores prefill steps
gained from 1024 tokens on, decode steps of up to 256 requests never did). `check_two_batch_overlap` refuses, at
start and with the reason, what the split forward does not serve.
Usage: `CompilationConfig(two_batch_overlap=MicroBatchConfig(512, 1024))`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapid_llm.config.flag_conflicts import refuse_combinations

FLAG = "--enable-two-batch-overlap"


@dataclass(frozen=True)
class MicroBatchConfig:
    decode_token_threshold: int = 512
    prefill_token_threshold: int = 1024

    def __post_init__(self) -> None:
        for flag, value in (("--dbo-decode-token-threshold", self.decode_token_threshold),
                            ("--dbo-prefill-token-threshold", self.prefill_token_threshold)):
            if value < 2:
                raise ValueError(f"{flag} must be at least 2 (each micro-batch needs a token), got {value}")

    def splits(self, num_tokens: int, decode_only: bool) -> bool:
        """Whether a step of `num_tokens` tokens runs as two micro-batches."""
        return num_tokens >= (self.decode_token_threshold if decode_only else self.prefill_token_threshold)


def check_two_batch_overlap(ranks: int, architecture_splits: bool, refusals: list[tuple[bool, str, str]]) -> None:
    """Raise, naming the flag that conflicts, when two-batch overlap cannot run: `refusals` are (conflict, flag,
    reason)."""
    if ranks < 2:
        raise ValueError(f"{FLAG} overlaps the ranks' communication with compute: it needs --tensor-parallel-size "
                         "of at least 2 or --afd-config")
    if not architecture_splits:
        raise ValueError(f"{FLAG}: this architecture's forward is not split by tokens (recurrent state or its own "
                         "attention); the Llama-family decoder stack is, MoE and DeepSeek-V2/V3 (MLA) included")
    refuse_combinations(FLAG, refusals)
