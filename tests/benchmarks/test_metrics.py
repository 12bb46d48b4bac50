"""Serving metrics against hand-computed values (definitions of vLLM's `vllm bench serve`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.common.metrics import (
    RequestOutcome,
    calculate_metrics,
    format_report,
    parse_goodput,
    parse_percentile_metrics,
    parse_percentiles,
    result_dict,
)


class WordTokenizer:
    """Counts whitespace-separated words as tokens, so re-tokenised counts are known by hand."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        return SimpleNamespace(input_ids=text.split())


def fixture_outcomes() -> list[RequestOutcome]:
    return [
        # 5 tokens (usage), TPOT = (0.3 - 0.1) / 4 = 50 ms.
        RequestOutcome(success=True, prompt_len=10, output_tokens=5, ttft=0.1, itl=[0.05] * 4, latency=0.3,
                       start_time=0.0),
        # One output token: no TPOT sample (but TPOT 0 for goodput).
        RequestOutcome(success=True, prompt_len=20, output_tokens=1, ttft=0.2, latency=0.2, start_time=0.5),
        RequestOutcome(success=False, prompt_len=30, error="boom"),
        # No usage: "a b c" re-tokenised to 3 tokens, TPOT = (0.6 - 0.4) / 2 = 100 ms.
        RequestOutcome(success=True, prompt_len=5, generated_text="a b c", ttft=0.4, itl=[0.1, 0.1], latency=0.6,
                       start_time=1.0),
    ]


def compute(outcomes, metrics=("ttft", "tpot", "itl", "e2el"), percentiles=(99,), goodput=None, duration=2.0):
    return calculate_metrics(outcomes, duration, WordTokenizer(), list(metrics), list(percentiles), goodput or {})


def test_counts_and_throughputs() -> None:
    m = compute(fixture_outcomes())
    assert (m.completed, m.failed) == (3, 1)
    assert m.total_input == 35  # the failed request's prompt does not count
    assert m.total_output == 9
    assert m.output_lens == [5, 1, 0, 3]
    assert m.request_throughput == pytest.approx(1.5)
    assert m.output_throughput == pytest.approx(4.5)
    assert m.total_token_throughput == pytest.approx(22.0)
    assert m.request_goodput is None


def test_latency_statistics() -> None:
    m = compute(fixture_outcomes())
    assert m.stats["ttft"].mean_ms == pytest.approx(700 / 3)
    assert m.stats["ttft"].median_ms == pytest.approx(200)
    # The single-token request has no TPOT: mean of 50 and 100, not of 50, 0 and 100.
    assert m.stats["tpot"].mean_ms == pytest.approx(75)
    assert m.stats["tpot"].std_ms == pytest.approx(25)  # population std, as numpy's default
    assert m.stats["itl"].mean_ms == pytest.approx(400 / 6)
    assert m.stats["e2el"].median_ms == pytest.approx(300)


def test_percentiles_interpolate_linearly() -> None:
    outcomes = [RequestOutcome(success=True, output_tokens=1, latency=ms / 1000) for ms in range(1, 11)]
    m = compute(outcomes, metrics=["e2el"], percentiles=[50, 90, 99, 99.9])
    assert list(m.stats) == ["e2el"]
    values = dict(m.stats["e2el"].percentiles_ms)
    assert values[50] == pytest.approx(5.5)
    assert values[90] == pytest.approx(9.1)
    assert values[99] == pytest.approx(9.91)
    result = result_dict(m, outcomes, 2.0)
    assert result["p90_e2el_ms"] == pytest.approx(9.1)
    assert result["p99.9_e2el_ms"] == pytest.approx(9.991)
    assert "mean_ttft_ms" not in result


def test_goodput_applies_every_slo() -> None:
    outcomes = fixture_outcomes()
    # A meets both; B's TTFT is fine and its single token counts as TPOT 0; D's TTFT is too slow.
    assert compute(outcomes, goodput={"ttft": 250, "tpot": 60}).request_goodput == pytest.approx(1.0)
    assert compute(outcomes, goodput={"e2el": 250}).request_goodput == pytest.approx(0.5)


def test_peak_concurrency_counts_requests_active_in_the_same_second() -> None:
    def active(start: float, end: float) -> RequestOutcome:
        return RequestOutcome(success=True, output_tokens=1, start_time=start, latency=end - start)

    # vLLM 0.32 buckets whole seconds: these two never overlap but both run within second 0.
    assert compute([active(0.0, 0.4), active(0.5, 0.9)]).max_concurrent_requests == 2
    assert compute([active(0.0, 0.4), active(1.5, 1.9)]).max_concurrent_requests == 1
    # A request counts in the second it ends in: all four are active in second 2.
    assert compute([active(0, 2), active(1, 3), active(2.2, 4), active(2.5, 2.6)]).max_concurrent_requests == 4
    # Failed requests are not counted.
    failed = RequestOutcome(success=False, start_time=0.0, latency=5.0)
    assert compute([active(0, 0.5), failed]).max_concurrent_requests == 1


def test_peak_output_throughput_counts_chunks_per_whole_second() -> None:
    first = RequestOutcome(success=True, output_tokens=3, start_time=0.0, ttft=0.1, itl=[0.2, 0.3], latency=0.6)
    # Chunks at 1.1, 1.2, 1.3, 1.4 s: four in the second [1, 2).
    second = RequestOutcome(success=True, output_tokens=4, start_time=0.5, ttft=0.6, itl=[0.1] * 3, latency=0.9)
    assert compute([first, second]).max_output_tokens_per_s == 4.0


def test_no_successes_reports_zeros() -> None:
    m = compute([RequestOutcome(success=False, error="x")])
    assert (m.completed, m.failed, m.max_output_tokens_per_s, m.max_concurrent_requests) == (0, 1, 0.0, 0)
    assert m.stats["ttft"].mean_ms == 0.0


def test_report_layout() -> None:
    m = compute(fixture_outcomes(), goodput={"ttft": 250})
    lines = format_report(m, 2.0, max_concurrency=4, request_rate=float("inf")).splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============"
    assert lines[-1] == "=" * 50
    assert "---------------Time to First Token----------------" in lines
    assert "-----Time per Output Token (excl. 1st token)------" in lines
    assert "{:<40} {:<10}".format("Maximum request concurrency:", 4) in lines
    assert "{:<40} {:<10.2f}".format("Request goodput (req/s):", 1.0) in lines
    assert "{:<40} {:<10.2f}".format("P99 TTFT (ms):", m.stats["ttft"].percentiles_ms[0][1]) in lines
    assert not any(line.startswith("Request rate configured") for line in lines)


def test_result_keys_follow_vllm() -> None:
    outcomes = fixture_outcomes()
    result = result_dict(compute(outcomes), outcomes, 2.0)
    assert list(result)[:21] == [
        "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
        "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
        "itls", "latencies", "start_times", "queue_times", "generated_texts", "errors",
        "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    ]
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert {f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", f"p99_{name}_ms"} <= set(result)
    assert result["errors"][2] == "boom"


@pytest.mark.parametrize("pairs", [["ttft"], ["ttft:fast"], ["foo:10"], ["ttft:-1"]])
def test_bad_goodput_is_rejected(pairs: list[str]) -> None:
    with pytest.raises(ValueError):
        parse_goodput(pairs)


def test_flag_parsers() -> None:
    assert parse_goodput(["ttft:200", "tpot:50"]) == {"ttft": 200.0, "tpot": 50.0}
    assert parse_goodput(None) == {}
    assert parse_percentile_metrics("ttft, e2el") == ["ttft", "e2el"]
    assert parse_percentiles("50,99.9") == [50.0, 99.9]
    with pytest.raises(ValueError):
        parse_percentile_metrics("ttft,latency")
    with pytest.raises(ValueError):
        parse_percentiles("101")
