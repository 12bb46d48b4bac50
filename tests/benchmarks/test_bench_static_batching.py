"""bench_static_batching.py: the batches, the send order against a fake request function, and a live run."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.server import ServerProcess

pytest.importorskip("aiohttp", reason="the benchmark client needs aiohttp")

from benchmarks import bench_static_batching  # noqa: E402
from benchmarks.common.backends import RequestInput  # noqa: E402
from benchmarks.common.metrics import RequestOutcome  # noqa: E402
from benchmarks.common.resources import ResourceSampler  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_static_batches_cover_every_request_in_order() -> None:
    assert bench_static_batching.static_batches(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert bench_static_batching.static_batches(4, 4) == [range(0, 4)]
    assert bench_static_batching.static_batches(0, 2) == []
    with pytest.raises(ValueError, match="at least 1"):
        bench_static_batching.static_batches(3, 0)


def test_a_batch_is_sent_only_after_the_previous_one_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    # Request i takes (i % 3 + 1) * 10 ms, so each batch's slowest member decides when the next starts.
    events: list[tuple[str, int, float]] = []

    async def fake_request(session: object, request: RequestInput) -> RequestOutcome:
        index = int(request.prompt)
        start = time.perf_counter()
        events.append(("start", index, start))
        await asyncio.sleep((index % 3 + 1) * 0.01)
        events.append(("end", index, time.perf_counter()))
        return RequestOutcome(success=True, start_time=start, latency=time.perf_counter() - start)

    monkeypatch.setitem(bench_static_batching.REQUEST_FUNCS, "openai", fake_request)
    args = argparse.Namespace(backend="openai", max_concurrency=3, num_warmups=0)
    inputs = [RequestInput("http://unused", "m", str(i), 1, 1, True, {}) for i in range(7)]
    outcomes, duration = asyncio.run(bench_static_batching.run_static_batches(
        args, inputs, [0.0] * 7, ResourceSampler([], 1.0, unavailable="not sampled in this test")))

    assert len(outcomes) == 7 and all(o.success for o in outcomes)
    for batch in bench_static_batching.static_batches(7, 3)[1:]:
        first_start = min(t for kind, i, t in events if kind == "start" and i in batch)
        previous_end = max(t for kind, i, t in events if kind == "end" and i < batch[0])
        assert first_start >= previous_end
    # Everything arrived at once, so a request's queue time is its batch's send time.
    assert [round(o.queue_time, 2) for o in outcomes[:3]] == [0.0] * 3
    assert all(o.queue_time >= 0.03 for o in outcomes[3:])
    assert outcomes[6].queue_time >= outcomes[3].queue_time + 0.03
    assert duration >= 0.07  # 30 + 30 + 10 ms: each batch as long as its slowest request


def test_static_batching_needs_a_batch_size() -> None:
    args = argparse.Namespace(backend="openai", max_concurrency=None, num_warmups=0)
    with pytest.raises(ValueError, match="--max-concurrency"):
        asyncio.run(bench_static_batching.run_static_batches(args, [], [], ResourceSampler([], 1.0)))


@pytest.mark.slow  # starts a server of its own: ~10 s on a quiet machine, far more on loaded shared cores
def test_static_batching_against_rapid_llm(tiny_checkpoint, tmp_path: Path) -> None:
    server = ServerProcess("--model", str(tiny_checkpoint("LlamaForCausalLM")), "--num-kv-blocks", "256",
                           "--log-level", "warning")
    try:
        command = [
            sys.executable, "benchmarks/bench_static_batching.py", "--base-url", server.base_url,
            "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "4",
            "--num-prompts", "6", "--max-concurrency", "4", "--temperature", "0", "--disable-tqdm",
            "--percentile-metrics", "ttft,e2el,client_queue_time", "--save-result", "--result-dir", str(tmp_path),
            "--result-filename", "static.json",
        ]
        run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "static batches of 4" in run.stdout
    result = json.loads((tmp_path / "static.json").read_text())
    assert result["completed"] == 6 and result["failed"] == 0 and result["max_concurrency"] == 4
    queue = result["queue_times"]
    # The second batch waited for the whole first one: at least its slowest request's latency.
    assert max(queue[:4]) < 0.05 and min(queue[4:]) >= max(result["latencies"][:4]) - 0.01
