"""/metrics against an in-process fake engine: vLLM's series, fed by the scheduler's stats and delta timings."""

from __future__ import annotations

import httpx
import pytest

from rapid_llm.ipc.messages import SchedulerStats
from tests.unit.fake_engine import REPLIES, FakeEngine


def metric(text: str, name: str) -> float:
    [value] = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
               or line.startswith(name + " ")]
    return value


async def test_metrics(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    text = (await client.get("/metrics")).text
    assert metric(text, "rapid_llm:num_requests_running") == 0 and metric(text, "rapid_llm:kv_cache_blocks_total") == 0
    await client.post("/v1/completions", json={"prompt": [3, 4, 5], "max_tokens": 5})
    await client.post("/v1/completions", json={"prompt": [3, 4], "max_tokens": 64, "stream": True})
    engine.scheduler_stats = SchedulerStats(num_running=2, num_waiting=1, kv_blocks_used=3, kv_blocks_total=12)
    response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    reply_tokens = len(engine.tokenizer.encode(REPLIES[0])) + 1
    assert metric(text, "rapid_llm:num_requests_running") == 2
    assert metric(text, "rapid_llm:num_requests_waiting") == 1
    assert metric(text, "rapid_llm:kv_cache_blocks_used") == 3
    assert metric(text, "rapid_llm:kv_cache_blocks_total") == 12
    assert metric(text, "rapid_llm:prompt_tokens_total") == 5
    assert metric(text, "rapid_llm:generation_tokens_total") == 5 + reply_tokens
    assert metric(text, "rapid_llm:time_to_first_token_seconds_count") == 2
    deltas = -(-5 // engine.tokens_per_delta) + -(-reply_tokens // engine.tokens_per_delta)
    assert metric(text, "rapid_llm:inter_token_latency_seconds_count") == deltas - 2
    assert metric(text, "rapid_llm:e2e_request_latency_seconds_count") == 2
    assert 'rapid_llm:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
    assert 'rapid_llm:request_success_total{finished_reason="stop",model_name="tiny"} 1.0' in text
    assert metric(text, "rapid_llm:time_per_output_token_seconds_count") == deltas - 2
    assert "_created" not in text
    assert metric(text, "process_resident_memory_bytes") > 0 and "python_info{" in text


async def test_request_histograms(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.queue_time, engine.prefill_time = 0.25, 0.5
    # Two prompts, n=2: choice seeds 0 and 1 for each, so each prompt's choices reply differently.
    await client.post("/v1/completions", json={"prompt": [[3, 4, 5], [6, 7]], "n": 2, "seed": 0, "max_tokens": 64})
    text = (await client.get("/metrics")).text
    lengths = [len(engine.tokenizer.encode(REPLIES[seed])) + 1 for seed in (0, 1)]
    assert metric(text, "rapid_llm:request_queue_time_seconds_count") == 4
    assert metric(text, "rapid_llm:request_queue_time_seconds_sum") == 4 * 0.25
    assert metric(text, "rapid_llm:request_prefill_time_seconds_sum") == 4 * 0.5
    decode = metric(text, "rapid_llm:request_decode_time_seconds_sum")
    assert metric(text, "rapid_llm:request_decode_time_seconds_count") == 4 and decode > 0
    assert metric(text, "rapid_llm:request_inference_time_seconds_sum") == pytest.approx(4 * 0.5 + decode)
    assert metric(text, "rapid_llm:request_time_per_output_token_seconds_count") == 4
    assert metric(text, "rapid_llm:request_prompt_tokens_sum") == 3 + 3 + 2 + 2
    assert metric(text, "rapid_llm:request_generation_tokens_sum") == 2 * sum(lengths)
    assert metric(text, "rapid_llm:request_max_num_generation_tokens_count") == 2
    assert metric(text, "rapid_llm:request_max_num_generation_tokens_sum") == 2 * max(lengths)


async def test_scheduler_counters_come_from_the_scheduler_totals(client: httpx.AsyncClient,
                                                                  engine: FakeEngine) -> None:
    text = (await client.get("/metrics")).text
    assert metric(text, "rapid_llm:num_preemptions_total") == 0
    assert metric(text, "rapid_llm:prefix_cache_queries_total") == 0
    assert metric(text, "rapid_llm:prefix_cache_hits_total") == 0
    assert metric(text, "rapid_llm:spec_decode_num_drafts_total") == 0
    engine.scheduler_stats = SchedulerStats(num_running=0, num_waiting=0, kv_blocks_used=0, kv_blocks_total=12,
                                            num_preemptions=3, prefix_cache_queries=1000, prefix_cache_hits=992,
                                            spec_decode_num_drafts=5, spec_decode_num_draft_tokens=15,
                                            spec_decode_num_accepted_tokens=9,
                                            spec_decode_num_accepted_tokens_per_pos=[5, 3, 1])
    text = (await client.get("/metrics")).text
    assert "# TYPE rapid_llm:prefix_cache_queries_total counter" in text
    assert metric(text, "rapid_llm:prefix_cache_queries_total") == 1000
    assert metric(text, "rapid_llm:prefix_cache_hits_total") == 992
    assert metric(text, "rapid_llm:num_preemptions_total") == 3
    assert metric(text, "rapid_llm:spec_decode_num_drafts_total") == 5
    assert metric(text, "rapid_llm:spec_decode_num_draft_tokens_total") == 15
    assert metric(text, "rapid_llm:spec_decode_num_accepted_tokens_total") == 9
    for position, value in enumerate([5, 3, 1]):
        assert (f'rapid_llm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny",position="{position}"}} '
                f'{float(value)}') in text
