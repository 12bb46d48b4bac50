"""bench_prefix_cache.py's workloads and report: a chat turn's prompt is the conversation so far (the previous
prompt, its real output ids, new user tokens), turns go round-robin, shared-prefix prompts start with their group's
system prompt, and the report has a row per configuration and workload."""

from __future__ import annotations

import argparse
import asyncio

from benchmarks import bench_prefix_cache


def _args(**overrides: object) -> argparse.Namespace:
    values = dict(conversations=3, turns=3, user_len=5, output_len=2, vocab=100, concurrency=2, seed=0, groups=2,
                  prompts_per_group=3, system_len=7)
    return argparse.Namespace(**{**values, **overrides})


def test_each_turn_extends_its_conversation_with_the_real_output(monkeypatch) -> None:
    sent: list[list[int]] = []

    async def complete(client, prompt, output_len):
        sent.append(list(prompt))
        return 0.01, [len(sent), len(sent)]  # distinct "output ids" per request

    monkeypatch.setattr(bench_prefix_cache, "complete", complete)
    ttfts = asyncio.run(bench_prefix_cache.multi_turn(None, _args()))
    assert len(ttfts) == len(sent) == 9
    first_turns, second_turns = sent[:3], sent[3:6]
    assert all(len(prompt) == 5 for prompt in first_turns)
    for first, second in zip(first_turns, second_turns):
        assert second[:5] == first and len(second) == 5 + 2 + 5
        assert second[5:7][0] == second[5:7][1] and second[5] in range(1, 4), "the first turn's output follows it"


def test_shared_prefix_prompts_start_with_their_system_prompt(monkeypatch) -> None:
    sent: list[list[int]] = []

    async def complete(client, prompt, output_len):
        sent.append(list(prompt))
        return 0.02, []

    monkeypatch.setattr(bench_prefix_cache, "complete", complete)
    ttfts = asyncio.run(bench_prefix_cache.shared_prefix(None, _args()))
    assert ttfts == [0.02] * 6 and all(len(prompt) == 12 for prompt in sent)
    assert len({tuple(prompt[:7]) for prompt in sent}) == 2
    assert all(token >= bench_prefix_cache.FIRST_TOKEN_ID for prompt in sent for token in prompt)


def test_the_report_has_a_row_per_configuration_and_workload(tmp_path) -> None:
    row = {"requests": 4, "duration_s": 1.0, "hit_rate": 0.5, "tier_hit_rate": 0.25, "median_ttft_ms": 10.0,
           "p90_ttft_ms": 20.0, "mean_ttft_ms": 12.0}
    results = {name: {workload: row for workload in bench_prefix_cache.WORKLOADS} for name in ("hash", "radix+tier")}
    bench_prefix_cache.write_report(results, tmp_path)
    table = (tmp_path / "summary.md").read_text().splitlines()
    assert len(table) == 2 + 4 and "| radix+tier | shared-prefix | 4 | 50.0 % (25.0 %) | 10.0 | 20.0 | 1.0 |" in table
    assert (tmp_path / "prefix_cache.png").stat().st_size > 0
