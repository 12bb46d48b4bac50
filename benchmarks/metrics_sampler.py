"""Sample a server's Prometheus /metrics counters at a fixed interval into a JSONL time series.

    python benchmarks/metrics_sampler.py --base-url http://127.0.0.1:30000 --out hits.jsonl \\
        --counters rapid_llm:prefix_cache_queries_total rapid_llm:prefix_cache_hits_total &
    ... run a benchmark ...; kill -TERM $!

Each line is {"t": seconds since the first sample, "<counter>": value, ...}; a counter the server does not
export is null. Runs until SIGTERM/SIGINT or --duration; one sample is always written at the end, so the
series covers the whole run. `hit_rate_series` turns a series into the hit rate per interval and cumulative.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx


def parse_counters(text: str, names: list[str]) -> dict[str, float | None]:
    """The value of each named metric in Prometheus text format, summed over its label sets; None if absent."""
    values: dict[str, float | None] = dict.fromkeys(names)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, rest = line.partition(" ")
        name = key.split("{", 1)[0]
        if name in values and rest:
            values[name] = (values[name] or 0.0) + float(rest.split()[0])
    return values


def hit_rate_series(samples: list[dict[str, Any]], queries: str, hits: str) -> list[dict[str, Any]]:
    """Per sample after the first: the hit rate (hits / queries, in tokens) over the interval since the previous
    sample and since the first one; None where no tokens were queried."""
    series = []
    for previous, sample in zip(samples, samples[1:]):
        asked, found = sample[queries] - previous[queries], sample[hits] - previous[hits]
        total_asked, total_found = sample[queries] - samples[0][queries], sample[hits] - samples[0][hits]
        series.append({"t": sample["t"], "queries": asked, "hits": found,
                       "interval_hit_rate": found / asked if asked else None,
                       "cumulative_hit_rate": total_found / total_asked if total_asked else None})
    return series


def sample_until(url: str, counters: list[str], interval: float, out: Path, stop: threading.Event,
                 duration: float | None = None) -> int:
    """Append one JSON line per interval to `out` until `stop` is set or `duration` passes; lines written."""
    start: float | None = None
    written = 0
    with httpx.Client(timeout=max(interval, 1.0)) as client, out.open("w") as sink:
        while True:
            finished = stop.is_set() or (start is not None and duration is not None
                                         and time.perf_counter() - start >= duration)
            values = parse_counters(client.get(url).raise_for_status().text, counters)
            now = time.perf_counter()
            start = now if start is None else start
            sink.write(json.dumps({"t": round(now - start, 3), **values}) + "\n")
            sink.flush()
            written += 1
            if finished:
                return written
            stop.wait(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:30000")
    parser.add_argument("--counters", nargs="+", required=True, help="Metric names, e.g. rapid_llm:..._total.")
    parser.add_argument("--interval", type=float, default=1.0, help="Seconds between samples.")
    parser.add_argument("--duration", type=float, default=None, help="Stop after this many seconds.")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write.")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return sample_until(args.base_url.rstrip("/") + "/metrics", args.counters, args.interval, args.out, stop,
                        args.duration)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
