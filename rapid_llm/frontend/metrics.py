"""Prometheus metrics for /metrics, named like vLLM's (`vllm:` -> `rapid_llm:`).

Key design choice: each app owns its CollectorRegistry (several apps in one test process never
collide), scheduler gauges and counters are refreshed from `engine.stats()` at scrape time (the
scheduler keeps the cumulative counts, so a counter is exported as its latest total), and latencies
are observed in the frontend from delta arrival times -- what a client would measure, minus the network.
Only the queue and prefill times come from the scheduler's clock, on a request's first delta.
Per-request histograms count each choice as one request, as vLLM counts each of n sequences.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from rapid_llm.ipc.messages import SchedulerStats, TextDelta

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# vLLM stops its 1-2-5 series at max_model_len, which the app does not hand to the metrics.
_TOKEN_COUNT_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))  # 1 to 500k

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
            ("external_prefix_cache_hits", "Prompt tokens loaded from the KV offload tier (--kv-offload-size).",
             self.stats.external_prefix_cache_hits),
            ("kv_offload_blocks_saved", "Evicted KV blocks saved into the offload tier.",
             self.stats.kv_offload_blocks_saved),
            ("kv_offload_blocks_loaded", "KV blocks loaded back from the offload tier.",
             self.stats.kv_offload_blocks_loaded),
            ("num_preemptions", "Requests preempted (to be recomputed) when the KV cache was full.",
             self.stats.num_preemptions),
            ("spec_decode_num_drafts", "Draft sequences verified (speculative decoding).",
             self.stats.spec_decode_num_drafts),
            ("spec_decode_num_draft_tokens", "Draft tokens verified.", self.stats.spec_decode_num_draft_tokens),
            ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", self.stats.spec_decode_num_accepted_tokens),
            ("collective_seconds", "Seconds tensor-parallel rank 0 spent in collectives (summed over replicas).",
             self.stats.collective_seconds),
            ("collective_calls", "Tensor-parallel collectives rank 0 ran.", self.stats.collective_calls),
            ("two_batch_overlap_steps", "Steps run as two overlapped micro-batches (--enable-two-batch-overlap).",
             self.stats.micro_batch_steps),
            ("spec_decode_num_disables", "Times a request stopped drafting: acceptance below the threshold.",
             self.stats.spec_decode_num_disables),
            ("spec_decode_num_gate_closes", "Times the speed gate turned speculation off: it measured no gain.",
             self.stats.spec_decode_num_gate_closes),
            ("kv_transfer_loads", "Prompts whose KV a decode instance loaded from a prefill instance.",
             self.stats.kv_transfer_loads),
            ("kv_transfer_failures", "KV loads that failed or timed out (the prompt was prefilled locally).",
             self.stats.kv_transfer_failures),
            ("kv_transfer_bytes", "Bytes of KV loaded from prefill instances.", self.stats.kv_transfer_bytes),
            ("kv_transfer_seconds", "Seconds the KV loads took, summed.", self.stats.kv_transfer_seconds),
            ("kv_transfer_expired_leases", "Prefill instance's KV leases that no decode instance read in time.",
             self.stats.kv_transfer_expired_leases),
        ):
            family = CounterMetricFamily(f"rapid_llm:{name}", doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
        per_position = CounterMetricFamily("rapid_llm:spec_decode_num_accepted_tokens_per_pos",
                                           "Draft tokens accepted, by position in the draft.",
                                           labels=["model_name", "position"])
        for position, value in enumerate(self.stats.spec_decode_num_accepted_tokens_per_pos):
            per_position.add_metric([self.model_name, str(position)], value)
        yield per_position


class _WithoutCreated(Collector):
    """The registry's families without their `_created` samples, which vLLM does not export either.

    prometheus_client's own switch (`disable_created_metrics`) is process-wide; filtering here leaves
    every other registry in the process as it is.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [sample for sample in family.samples if sample.name != family.name + "_created"]
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
        def latency(name: str, doc: str) -> Histogram:
            return histogram(name, doc, _REQUEST_LATENCY_BUCKETS)

        def token_count(name: str, doc: str) -> Histogram:
            return histogram(name, doc, _TOKEN_COUNT_BUCKETS)

        self.ttft = histogram("time_to_first_token_seconds", "Time to the first token.", _TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between successive outputs of a choice.",
                             _ITL_BUCKETS)
        self.tpot = histogram("time_per_output_token_seconds", "Deprecated in vLLM, still read by its Grafana "
                              "dashboard: the same observations as inter_token_latency_seconds.", _ITL_BUCKETS)
        self.request_tpot = histogram("request_time_per_output_token_seconds", "A choice's decode time per output "
                                      "token after the first (0 for a single token, as in vLLM).", _ITL_BUCKETS)
        self.e2e = latency("e2e_request_latency_seconds", "Time from arrival to the last choice finishing.")
        self.queue_time = latency("request_queue_time_seconds", "Time a choice waited before its first admission.")
        self.prefill_time = latency("request_prefill_time_seconds", "First admission to first sampled token.")
        self.decode_time = latency("request_decode_time_seconds", "A choice's first output to its last.")
        self.inference_time = latency("request_inference_time_seconds", "Prefill plus decode time of a choice.")
        self.request_prompt_tokens = token_count("request_prompt_tokens", "Prompt tokens of a finished choice.")
        self.request_generation_tokens = token_count("request_generation_tokens", "Tokens a finished choice made.")
        self.request_max_generation_tokens = token_count("request_max_num_generation_tokens",
                                                         "Most tokens any of a prompt's n choices generated.")
        self._success = Counter("rapid_llm:request_success", "Finished choices by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self._scheduler_counters = _SchedulerCounters(model_name)
        self.registry.register(self._scheduler_counters)
        # What vLLM's default registry adds: process_* (memory, CPU, fds), python_info and python_gc_*.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._exposed = _WithoutCreated(self.registry)

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
        return generate_latest(self._exposed)

    def track(self, num_prompt_tokens: int, num_choices: int, n: int) -> RequestTracker:
        """A tracker for one HTTP request: `num_choices` choices, `n` for each of its prompts in turn."""
        return RequestTracker(self, num_prompt_tokens, num_choices, n)


@dataclass
class _Choice:
    """One choice's arrivals (frontend clock) and what its deltas reported."""

    first_output: float | None = None
    last_output: float | None = None
    num_tokens: int = 0
    queue_time: float | None = None
    prefill_time: float | None = None
    finished: bool = False


class RequestTracker:
    """Latency and token accounting for one HTTP request and its choices."""

    def __init__(self, metrics: FrontendMetrics, num_prompt_tokens: int, num_choices: int, n: int) -> None:
        self.metrics = metrics
        self.num_prompt_tokens = num_prompt_tokens
        self.n = n
        self.arrival = time.perf_counter()
        self.started = False
        self.got_first_token = False
        self.choices = [_Choice() for _ in range(num_choices)]

    def observe(self, index: int, delta: TextDelta) -> None:
        now = time.perf_counter()
        metrics = self.metrics
        choice = self.choices[index]
        if not self.started:
            self.started = True
            metrics.prompt_tokens.inc(self.num_prompt_tokens)
        if delta.queue_time is not None:
            choice.queue_time, choice.prefill_time = delta.queue_time, delta.prefill_time
        if delta.token_ids:
            metrics.generation_tokens.inc(len(delta.token_ids))
            choice.num_tokens += len(delta.token_ids)
            if choice.last_output is not None:
                metrics.itl.observe(now - choice.last_output)
                metrics.tpot.observe(now - choice.last_output)
            else:
                choice.first_output = now
                if not self.got_first_token:
                    self.got_first_token = True
                    metrics.ttft.observe(now - self.arrival)
            choice.last_output = now
        if delta.finish_reason is not None:
            choice.finished = True
            metrics.count_finished(delta.finish_reason)
            self._observe_finished(index, delta.num_prompt_tokens)
            if all(c.finished for c in self.choices):
                metrics.e2e.observe(now - self.arrival)

    def _observe_finished(self, index: int, num_prompt_tokens: int) -> None:
        metrics, choice = self.metrics, self.choices[index]
        metrics.request_prompt_tokens.observe(num_prompt_tokens)
        metrics.request_generation_tokens.observe(choice.num_tokens)
        if choice.first_output is not None and choice.last_output is not None:
            decode_time = choice.last_output - choice.first_output
            metrics.decode_time.observe(decode_time)
            metrics.request_tpot.observe(decode_time / (choice.num_tokens - 1) if choice.num_tokens > 1 else 0.0)
            if choice.queue_time is not None and choice.prefill_time is not None:
                metrics.queue_time.observe(choice.queue_time)
                metrics.prefill_time.observe(choice.prefill_time)
                metrics.inference_time.observe(choice.prefill_time + decode_time)
        start = index - index % self.n
        siblings = self.choices[start : start + self.n]
        if all(c.finished for c in siblings):
            metrics.request_max_generation_tokens.observe(max(c.num_tokens for c in siblings))

    def close(self) -> None:
        """Count choices that never finished (client gone, server error) as aborted."""
        for choice in self.choices:
            if not choice.finished:
                choice.finished = True
                self.metrics.count_finished("abort")
