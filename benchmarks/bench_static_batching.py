"""Static batching emulated on the client, for comparison with a server's continuous batching.

    python benchmarks/bench_static_batching.py --port 30000 --max-concurrency 8 --dataset-name random ...

Every flag is bench_serving.py's, and so are the metrics and the result file; only the sending differs:
requests go out in batches of `--max-concurrency` in workload order, and a batch is sent only once the
previous one has completely finished (and its own last request has arrived, under a finite
`--request-rate`). The server still batches continuously; the emulation only withholds new work from it,
which is what a static-batching engine does to the requests waiting behind the running batch. A request's
`client_queue_time` is the wait from its arrival to its batch's send, as a concurrency slot's wait is in
bench_serving.py, so the two runs' latency distributions compare directly.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file (python benchmarks/bench_static_batching.py): make `benchmarks` importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_serving
from benchmarks.common.backends import REQUEST_FUNCS, RequestInput, open_session
from benchmarks.common.metrics import RequestOutcome
from benchmarks.common.resources import ResourceSampler


def static_batches(num_requests: int, batch_size: int) -> list[range]:
    """The request indices of each batch, in order; the last batch may be smaller."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    return [range(start, min(start + batch_size, num_requests)) for start in range(0, num_requests, batch_size)]


async def run_static_batches(
    args: argparse.Namespace, inputs: list[RequestInput], offsets: list[float], sampler: ResourceSampler
) -> tuple[list[RequestOutcome], float]:
    """bench_serving's runner contract: send the warm-ups, then each batch once the previous has finished;
    (outcomes in workload order, duration in s)."""
    if args.max_concurrency is None:
        raise ValueError("static batching needs --max-concurrency (the batch size)")
    request_func = REQUEST_FUNCS[args.backend]
    async with open_session(args.max_concurrency) as session:
        if args.num_warmups:
            print(f"Warming up with {args.num_warmups} requests...")
            for batch in static_batches(args.num_warmups, args.max_concurrency):
                await asyncio.gather(*(request_func(session, inputs[0]) for _ in batch))

        print(f"Starting main benchmark run (static batches of {args.max_concurrency})...")
        outcomes: list[RequestOutcome] = []
        with sampler:
            start = time.perf_counter()
            for batch in static_batches(len(inputs), args.max_concurrency):
                delay = start + offsets[batch[-1]] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                done = await asyncio.gather(*(request_func(session, inputs[i]) for i in batch))
                for index, outcome in zip(batch, done):
                    outcome.queue_time = outcome.start_time - (start + offsets[index])
                outcomes.extend(done)
            duration = time.perf_counter() - start
        return outcomes, duration


def main(argv: list[str] | None = None) -> dict:
    return bench_serving.main(argv, runner=run_static_batches)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError) as exc:
        sys.exit(f"error: {exc}")
