"""DataParallelClient: the EngineClient over D replicas, each reached through its own TokenizerManager.

Key design choice: a replica is a whole engine (scheduler, detokenizer, ranks) with its own sockets, so the
client is composition: `generate` asks the Router for a replica and iterates that replica's manager, which
already sends the request's abort (client gone) to the scheduler that owns it; tokens streamed back update
the router's outstanding counts. `flush_cache` flushes every replica (True only if all flushed); `stats`
sums the replicas' snapshots (what the unlabelled /metrics families show); `replica_stats` and the
`ReplicaCollector` export them per replica with a `dp_rank` label. /server_info adds the live router counts.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any, AsyncIterator

from rapid_llm.frontend.router import Router
from rapid_llm.frontend.tokenizer_manager import TokenizerManager
from rapid_llm.ipc.messages import SchedulerStats, TextDelta
from rapid_llm.sampling import SamplingParams


def sum_stats(snapshots: list[SchedulerStats | None]) -> SchedulerStats | None:
    """One snapshot whose counts are the replicas' sums (None before any replica reported)."""
    present = [stats for stats in snapshots if stats is not None]
    if not present:
        return None
    totals: dict[str, Any] = {}
    for name in SchedulerStats.__struct_fields__:
        values = [getattr(stats, name) for stats in present]
        if isinstance(values[0], list):
            width = max(len(value) for value in values)
            totals[name] = [sum(value[i] for value in values if i < len(value)) for i in range(width)]
        else:
            totals[name] = sum(values)
    return SchedulerStats(**totals)


class DataParallelClient:
    def __init__(self, replicas: list[TokenizerManager], router: Router, server_info: dict[str, Any]) -> None:
        first = replicas[0]
        self.replicas = replicas
        self.router = router
        self.model_name, self.model_path = first.model_name, first.model_path
        self.max_model_len, self.vocab_size = first.max_model_len, first.vocab_size
        self.tokenizer, self.enable_prefix_caching = first.tokenizer, first.enable_prefix_caching
        self._server_info = server_info

    @property
    def server_info(self) -> dict[str, Any]:
        replicas = []
        for rank, (load, stats) in enumerate(zip(self.router.loads, self.replica_stats())):
            replicas.append({"dp_rank": rank, "requests_routed": load.routed, "requests_in_flight": load.in_flight,
                             "outstanding_tokens": load.outstanding_tokens, "cache_routed": load.cache_routed,
                             "num_running": stats.num_running if stats else 0,
                             "num_waiting": stats.num_waiting if stats else 0,
                             "prefix_cache_hits": stats.prefix_cache_hits if stats else 0})
        return {**self._server_info, "dp_replicas": replicas}

    async def start(self) -> None:
        for replica in self.replicas:
            await replica.start()

    async def stop(self) -> None:
        for replica in self.replicas:
            await replica.stop()

    def fail_all(self, message: str) -> None:
        for replica in self.replicas:
            replica.fail_all(message)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[TextDelta]:
        replica = self.router.route(request_id, prompt_token_ids, params.max_tokens or 0)
        try:
            # Closed with this iterator, so a client gone aborts in the replica at once, not when collected.
            async with aclosing(self.replicas[replica].generate(request_id, prompt_token_ids, params)) as deltas:
                async for delta in deltas:
                    self.router.progress(request_id, len(delta.token_ids))
                    yield delta
        finally:
            self.router.finish(request_id)

    async def flush_cache(self) -> bool:
        results = await asyncio.gather(*(replica.flush_cache() for replica in self.replicas))
        return all(results)

    def stats(self) -> SchedulerStats | None:
        return sum_stats(self.replica_stats())

    def replica_stats(self) -> list[SchedulerStats | None]:
        return [replica.stats() for replica in self.replicas]

    def is_healthy(self) -> bool:
        return all(replica.is_healthy() for replica in self.replicas)
