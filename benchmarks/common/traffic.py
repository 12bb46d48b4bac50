"""Request arrival times for `--request-rate` and `--burstiness`, as `vllm bench serve` draws them.

Key design choice: gaps come from numpy's legacy RandomState seeded with `--seed`, drawn one per
request like vLLM's `np.random.gamma` calls after `np.random.seed(seed)`, and the schedule is then
rescaled so the last request arrives at exactly num_requests / rate -- so a seed gives the same
arrival times as in vLLM and runs with different seeds differ in order, not in average rate.
"""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent.

    `request_rate` inf sends everything at once; otherwise gaps follow a gamma distribution with
    shape `burstiness` and mean 1/rate (burstiness 1: Poisson arrivals; below 1: burstier; inf: even).
    """
    if num_requests < 1:
        raise ValueError(f"need at least one request, got {num_requests}")
    if not request_rate > 0:
        raise ValueError(f"--request-rate must be positive, got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"--burstiness must be positive, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps = [1.0 / request_rate] * num_requests
    else:
        state = np.random.RandomState(seed)
        scale = 1.0 / (request_rate * burstiness)
        gaps = [float(state.gamma(shape=burstiness, scale=scale)) for _ in range(num_requests)]
    offsets = np.cumsum(gaps)
    return (offsets * (num_requests / request_rate / offsets[-1])).tolist()
