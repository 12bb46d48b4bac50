"""Prometheus metrics for /metrics, named like vLLM's (`vllm:` -> `rapid_llm:`).

Key design choice: each app owns its CollectorRegistry (several apps in one test process never
collide), scheduler gauges and counters are refreshed from `engine.stats()` at scrape time (the
scheduler keeps the cumulative counts, so a counter is exported as its latest total), and latencies
are observed in the frontend from delta arrival times -- what a client would measure, minus the network.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from rapid_llm.ipc.messages import SchedulerStats, TextDelta

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0, 7680.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST

_NO_STATS = SchedulerStats(num_running=0, num_waiting=0, kv_blocks_used=0, kv_blocks_total=0)


class _SchedulerCounters(Collector):
    """Counters whose totals the scheduler keeps: exported as the latest snapshot's values."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats = _NO_STATS

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, doc, value in (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", self.stats.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", self.stats.prefix_cache_hits),
        ):
            family = CounterMetricFamily(f"rapid_llm:{name}", doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family


class FrontendMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"rapid_llm:{name}", doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"rapid_llm:{name}", doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"rapid_llm:{name}", doc, labels, buckets=buckets, registry=self.registry).labels(
                model_name
            )

        self.num_running = gauge("num_requests_running", "Requests the scheduler is running.")
        self.num_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_blocks_used = gauge("kv_cache_blocks_used", "KV cache blocks referenced by requests (blocks that "
                                    "only cache a prefix count as free).")
        self.kv_blocks_total = gauge("kv_cache_blocks_total", "KV cache blocks in the pool.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that started generating.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.ttft = histogram("time_to_first_token_seconds", "Time to the first token.", _TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between successive outputs of a choice.",
                             _ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Time from arrival to the last choice finishing.",
                             _E2E_BUCKETS)
        self._success = Counter("rapid_llm:request_success", "Finished choices by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self._scheduler_counters = _SchedulerCounters(model_name)
        self.registry.register(self._scheduler_counters)

    def count_finished(self, reason: str) -> None:
        self._success.labels(self.model_name, reason).inc()

    def render(self, stats: SchedulerStats | None) -> bytes:
        """The exposition text, with the scheduler's numbers taken from `stats` (zeros before any report)."""
        stats = stats or _NO_STATS
        self._scheduler_counters.stats = stats
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_blocks_used.set(stats.kv_blocks_used)
        self.kv_blocks_total.set(stats.kv_blocks_total)
        self.kv_usage.set(stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0)
        return generate_latest(self.registry)

    def track(self, num_prompt_tokens: int, num_choices: int) -> RequestTracker:
        return RequestTracker(self, num_prompt_tokens, num_choices)


class RequestTracker:
    """Latency and token accounting for one HTTP request and its choices."""

    def __init__(self, metrics: FrontendMetrics, num_prompt_tokens: int, num_choices: int) -> None:
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.arrival = time.perf_counter()
        self.started = False
        self.got_first_token = False
        self.last_output: list[float | None] = [None] * num_choices
        self.finished = [False] * num_choices

    def observe(self, index: int, delta: TextDelta) -> None:
        now = time.perf_counter()
        metrics = self.metrics
        if not self.started:
            self.started = True
            metrics.prompt_tokens.inc(self.num_prompt_tokens)
        if delta.token_ids:
            metrics.generation_tokens.inc(len(delta.token_ids))
            last = self.last_output[index]
            if last is not None:
                metrics.itl.observe(now - last)
            elif not self.got_first_token:
                self.got_first_token = True
                metrics.ttft.observe(now - self.arrival)
            self.last_output[index] = now
        if delta.finish_reason is not None:
            self.finished[index] = True
            metrics.count_finished(delta.finish_reason)
            if all(self.finished):
                metrics.e2e.observe(now - self.arrival)

    def close(self) -> None:
        """Count choices that never finished (client gone, server error) as aborted."""
        for index, done in enumerate(self.finished):
            if not done:
                self.finished[index] = True
                self.metrics.count_finished("abort")
