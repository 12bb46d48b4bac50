"""How many threads the worker's CPU ops use, step by step: every core for steps of many tokens or over long
contexts, and for other steps (short-context decodes) every core only when the model's layers are big enough.

On a small CPU the worker shares its cores with the frontend, scheduler and detokenizer (and, in a
benchmark, the load generator). Each parallel op waits for its slowest thread, and a thread that another
process has preempted stalls it for a scheduler time slice: with decode-sized work that stall costs more
than the second thread saves. Measured on 2 cores (docs/benchmarks.md, "Worker threads"): llama-10m
(largest weight 1 MiB) serves 12-25 % more tokens/s with one thread at concurrency 8, llama-100m (7.5 MiB)
37 % fewer. A step of many tokens (a prompt chunk) gives every thread enough work to outweigh a stall:
see MIN_PARALLEL_STEP_TOKENS; so does attention over a long context (MIN_PARALLEL_STEP_CONTEXT).
OMP_NUM_THREADS, when set, fixes the count for every step.
Usage: `policy, reason = cpu_thread_policy(model, torch.get_num_threads())`, then
`policy.apply(num_tokens, context_tokens)` before each step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

# Between llama-10m's 1 MiB (one thread wins at decode) and llama-100m's 7.5 MiB (all cores win).
MIN_PARALLEL_WEIGHT_BYTES = 4 << 20
# A llama-10m prefill step in-process (benchmarks/prefill_step_timing.py, 2-core AMD EPYC, median of 5):
# 2 threads take 0.75x the time of 1 at 32 tokens, 0.65x at 64, 0.59x at 128, 0.54x at 512. The server's
# other processes share the cores, so the step must be long enough for the gain to survive a stall.
MIN_PARALLEL_STEP_TOKENS = 64
# Decodes of llama-10m-8k served at concurrency 1 (benchmarks/peers/compare_long_context.sh, same machine):
# TPOT 8.3 -> 6.9 ms at 4000 tokens of context and 13.3 -> 9.1 ms at 8000 with two threads; at
# concurrency 8 with ~150-token contexts (1,200 in the step) one thread is faster (above).
MIN_PARALLEL_STEP_CONTEXT = 2048


@dataclass(frozen=True)
class CpuThreadPolicy:
    short_step_threads: int  # steps under both MIN_PARALLEL_STEP_TOKENS and MIN_PARALLEL_STEP_CONTEXT
    long_step_threads: int

    def threads_for(self, num_tokens: int, context_tokens: int = 0) -> int:
        """`context_tokens`: the tokens the step's sequences attend to, summed over them."""
        long = num_tokens >= MIN_PARALLEL_STEP_TOKENS or context_tokens >= MIN_PARALLEL_STEP_CONTEXT
        return self.long_step_threads if long else self.short_step_threads

    def apply(self, num_tokens: int, context_tokens: int = 0) -> None:
        """Set torch's thread count for a step (only when it changes)."""
        threads = self.threads_for(num_tokens, context_tokens)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def cpu_thread_policy(model: nn.Module, available: int) -> tuple[CpuThreadPolicy, str]:
    """The per-step thread counts for the worker's ops on the CPU, and why."""
    if os.environ.get("OMP_NUM_THREADS"):
        return CpuThreadPolicy(available, available), "OMP_NUM_THREADS is set"
    largest = max((p.numel() * p.element_size() for p in model.parameters() if p.dim() >= 2), default=0)
    if available > 1 and largest < MIN_PARALLEL_WEIGHT_BYTES:
        return CpuThreadPolicy(1, available), (
            f"the largest weight is {largest / 2**20:.1f} MiB < {MIN_PARALLEL_WEIGHT_BYTES >> 20} MiB: one thread "
            f"for steps under {MIN_PARALLEL_STEP_TOKENS} tokens and {MIN_PARALLEL_STEP_CONTEXT} tokens of context "
            f"(more would stall on the cores the serving processes share), {available} for the others")
    return CpuThreadPolicy(available, available), f"the largest weight is {largest / 2**20:.1f} MiB"
