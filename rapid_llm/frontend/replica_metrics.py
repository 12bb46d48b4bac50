"""ReplicaCollector: per-replica Prometheus families for data parallelism, labelled `dp_rank`.

Key design choice: the unlabelled families (`rapid_llm:num_requests_running`, ...) keep their meaning -- the
whole server, summed over replicas by `DataParallelClient.stats` -- and each replica's share is exported
under `rapid_llm:dp_*` names, so a dashboard built for one engine still reads totals. Values are read at
scrape time from the router's counts and each replica's latest scheduler snapshot.
Usage: `build_app(client, options, collectors=[ReplicaCollector(client)])`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from rapid_llm.frontend.router import ReplicaLoad
from rapid_llm.ipc.messages import SchedulerStats

if TYPE_CHECKING:
    from rapid_llm.frontend.dp_client import DataParallelClient


class ReplicaCollector(Collector):
    def __init__(self, client: DataParallelClient) -> None:
        self.client = client

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "dp_rank"]
        rows = list(zip(self.client.router.loads, self.client.replica_stats()))
        for kind, name, doc, value in _FAMILIES:
            family = kind(f"rapid_llm:dp_{name}", doc, labels=labels)
            for rank, (load, stats) in enumerate(rows):
                family.add_metric([self.client.model_name, str(rank)], value(load, stats or _NO_STATS))
            yield family


def _kv_usage(stats: SchedulerStats) -> float:
    return stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0


_NO_STATS = SchedulerStats(num_running=0, num_waiting=0, kv_blocks_used=0, kv_blocks_total=0)
_Value = Callable[[ReplicaLoad, SchedulerStats], float]
_FAMILIES: tuple[tuple[type, str, str, _Value], ...] = (
    (CounterMetricFamily, "requests_routed", "Requests the router sent to the replica.", lambda load, _: load.routed),
    (CounterMetricFamily, "requests_cache_routed", "Of those, requests sent there for a cached prompt prefix "
     "(cache_aware).", lambda load, _: load.cache_routed),
    (GaugeMetricFamily, "requests_in_flight", "Requests routed to the replica and not finished.",
     lambda load, _: load.in_flight),
    (GaugeMetricFamily, "outstanding_tokens", "Prompt + max_tokens - generated tokens of the replica's requests in "
     "flight.", lambda load, _: load.outstanding_tokens),
    (GaugeMetricFamily, "num_requests_running", "Requests the replica's scheduler is running.",
     lambda _, stats: stats.num_running),
    (GaugeMetricFamily, "num_requests_waiting", "Requests waiting in the replica's scheduler.",
     lambda _, stats: stats.num_waiting),
    (GaugeMetricFamily, "kv_cache_usage_perc", "Fraction of the replica's KV blocks in use (0 to 1).",
     lambda _, stats: _kv_usage(stats)),
    (CounterMetricFamily, "prefix_cache_hits", "Prompt tokens the replica found in its prefix cache.",
     lambda _, stats: stats.prefix_cache_hits),
    (CounterMetricFamily, "prefix_cache_queries", "Prompt tokens the replica looked up in its prefix cache.",
     lambda _, stats: stats.prefix_cache_queries),
    (CounterMetricFamily, "collective_seconds", "Seconds the replica's rank 0 spent in tensor-parallel "
     "collectives.", lambda _, stats: stats.collective_seconds),
)
