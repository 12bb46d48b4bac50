"""DataParallelClient over in-process fake replicas: a request is served by the replica the router chose, the
router's outstanding tokens follow the streamed deltas and are released when the client stops reading
(the owning replica then aborts it), flushes go to every replica, and stats are summed."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from rapid_llm.frontend.dp_client import DataParallelClient
from rapid_llm.frontend.router import Router
from rapid_llm.ipc.messages import SchedulerStats, TextDelta
from rapid_llm.sampling import SamplingParams


class FakeReplica:
    """Streams one token per delta; records what it served and which streams were closed early."""

    model_name, model_path, max_model_len, vocab_size, tokenizer, enable_prefix_caching = "m", "/m", 64, 100, None, True

    def __init__(self, flushed: bool, running: int) -> None:
        self.served: list[str] = []
        self.aborted: list[str] = []
        self.flushed = flushed
        self.running = running

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams) -> AsyncIterator[TextDelta]:
        self.served.append(request_id)
        finished = False
        try:
            for i in range(params.max_tokens):
                finished = i == params.max_tokens - 1
                yield TextDelta(request_id, "x", [7], finish_reason="length" if finished else None)
        finally:
            if not finished:
                self.aborted.append(request_id)

    async def flush_cache(self) -> bool:
        return self.flushed

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=self.running, num_waiting=0, kv_blocks_used=1, kv_blocks_total=8)

    def is_healthy(self) -> bool:
        return True


def client(*replicas: FakeReplica) -> DataParallelClient:
    return DataParallelClient(list(replicas), Router(len(replicas), "minimum_tokens", 4, 16), {"model": "m"})


def test_requests_follow_the_router_and_release_their_load() -> None:
    async def run() -> None:
        first, second = FakeReplica(True, 1), FakeReplica(True, 2)
        dp = client(first, second)
        params = SamplingParams(max_tokens=3)
        whole = [delta async for delta in dp.generate("a", [1, 2], params)]
        assert len(whole) == 3 and first.served == ["a"]
        # Both idle again: the tie goes to the replica after the last one chosen.
        stream = dp.generate("b", [1, 2, 3, 4, 5], SamplingParams(max_tokens=10))  # 15 outstanding
        await stream.__anext__()
        assert second.served == ["b"] and dp.router.loads[1].outstanding_tokens == 14
        assert [delta.token_ids async for delta in dp.generate("c", [1], params)] == [[7]] * 3
        assert first.served == ["a", "c"]  # replica 1 is busy with b
        await stream.aclose()  # the client went away
        assert second.aborted == ["b"] and dp.router.loads[1].outstanding_tokens == 0
        assert dp.router.loads[1].in_flight == 0
        assert [replica["requests_routed"] for replica in dp.server_info["dp_replicas"]] == [2, 1]

    asyncio.run(run())


def test_flush_and_stats_cover_every_replica() -> None:
    async def flushes(*replicas: FakeReplica) -> bool:
        return await client(*replicas).flush_cache()

    assert asyncio.run(flushes(FakeReplica(True, 0), FakeReplica(True, 0)))
    assert not asyncio.run(flushes(FakeReplica(True, 0), FakeReplica(False, 0)))
    stats = client(FakeReplica(True, 1), FakeReplica(True, 2)).stats()
    assert (stats.num_running, stats.kv_blocks_used, stats.kv_blocks_total) == (3, 2, 16)
