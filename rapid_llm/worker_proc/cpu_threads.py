"""How many threads the worker's CPU ops use: every core only when the model's layers are big enough.

On a small CPU the worker shares its cores with the frontend, scheduler and detokenizer (and, in a
benchmark, the load generator). Each parallel op waits for its slowest thread, and a thread that another
process has preempted stalls it for a scheduler time slice: with decode-sized layers that stall costs
more than the second thread saves. Measured on 2 cores (docs/benchmarks.md, "Worker threads"):
llama-10m (largest weight 1 MiB) serves 12-25 % more tokens/s with one thread at concurrency 8,
llama-100m (7.5 MiB) 37 % fewer. OMP_NUM_THREADS, when set, is kept as it is.
Usage: `threads, reason = choose_cpu_threads(model, torch.get_num_threads())`.
"""

from __future__ import annotations

import os

from torch import nn

# Between llama-10m's 1 MiB (one thread wins) and llama-100m's 7.5 MiB (all cores win).
MIN_PARALLEL_WEIGHT_BYTES = 4 << 20


def choose_cpu_threads(model: nn.Module, available: int) -> tuple[int, str]:
    """The thread count for the worker's ops on the CPU, and why."""
    if os.environ.get("OMP_NUM_THREADS"):
        return available, "OMP_NUM_THREADS is set"
    largest = max((p.numel() * p.element_size() for p in model.parameters() if p.dim() >= 2), default=0)
    if available > 1 and largest < MIN_PARALLEL_WEIGHT_BYTES:
        return 1, (f"the largest weight is {largest / 2**20:.1f} MiB < {MIN_PARALLEL_WEIGHT_BYTES >> 20} MiB: "
                   "more threads would stall on the cores the serving processes share")
    return available, f"the largest weight is {largest / 2**20:.1f} MiB"
