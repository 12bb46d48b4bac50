"""Serving metrics with the exact definitions of `vllm bench serve` (vLLM 0.32, vllm/benchmarks/serve.py).

Key design choice: every number is computed the way vLLM computes it -- including its quirks (one ITL
per streamed chunk, TPOT over the usage token count, peak output rate and peak concurrency in
whole-second buckets, numpy's linear-interpolation percentiles and population std) -- so a result from
this module can be put next to a vLLM or SGLang result and mean the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

MS_PER_S = 1000.0

# name -> (short name, section header), in vLLM's print order.
PERCENTILE_METRICS: dict[str, tuple[str, str]] = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
    "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
    "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency"),
}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestOutcome:
    """One request as the client saw it; times in seconds from `time.perf_counter`."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    # From the stream's usage chunk; 0 means the server sent none and the text is re-tokenised.
    output_tokens: int = 0
    generated_text: str = ""
    ttft: float = 0.0
    # One entry per streamed chunk after the first: the gap since the previous chunk.
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    # Time spent waiting for a --max-concurrency slot before the request was sent.
    queue_time: float = 0.0


@dataclass(frozen=True)
class Stats:
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: list[tuple[float, float]]


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    # None when no --goodput SLOs were given.
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    # Per request, in order; 0 for a failed request.
    output_lens: list[int]
    # Only the selected percentile metrics, in PERCENTILE_METRICS order.
    stats: dict[str, Stats]


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """`["ttft:200", "tpot:50"]` -> `{"ttft": 200.0, "tpot": 50.0}` (milliseconds)."""
    slos: dict[str, float] = {}
    for pair in pairs or []:
        name, _, value = pair.partition(":")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--goodput takes KEY:VALUE pairs with VALUE in milliseconds, got {pair!r}") from None
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput metric must be one of {list(GOODPUT_METRICS)}, got {name!r}")
        if number < 0:
            raise ValueError(f"--goodput value must be non-negative, got {pair!r}")
        slos[name] = number
    return slos


def parse_percentile_metrics(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in PERCENTILE_METRICS]
    if unknown:
        raise ValueError(f"--percentile-metrics: unknown {unknown}; allowed: {list(PERCENTILE_METRICS)}")
    return names


def parse_percentiles(text: str) -> list[float]:
    try:
        percentiles = [float(p) for p in text.split(",")]
    except ValueError:
        raise ValueError(f"--metric-percentiles takes comma-separated numbers, got {text!r}") from None
    if any(not 0 <= p <= 100 for p in percentiles):
        raise ValueError(f"--metric-percentiles must lie in [0, 100], got {text!r}")
    return percentiles


def _stats(values_s: list[float], percentiles: list[float]) -> Stats:
    # vLLM reports 0 for a metric with no samples (np.mean(values or 0)).
    values = np.asarray(values_s or [0.0], dtype=np.float64) * MS_PER_S
    return Stats(
        mean_ms=float(np.mean(values)),
        median_ms=float(np.median(values)),
        std_ms=float(np.std(values)),
        percentiles_ms=[(p, float(np.percentile(values, p))) for p in percentiles],
    )


def _peak_per_second(successes: list[RequestOutcome]) -> tuple[float, int]:
    """(most chunks arriving, most requests active) within one whole second, as vLLM 0.32 counts them.

    Seconds are counted from the first request's start; a request is active in every second from the
    one it starts in to the one it ends in, both included.
    """
    first_start = min(o.start_time for o in successes)
    last_end = max(o.start_time + o.latency for o in successes)
    num_seconds = int(np.ceil(last_end - first_start)) + 1
    # Summed in vLLM's order (first chunk time, then each gap added in turn), so the times are bit-identical.
    chunk_times = np.concatenate([np.cumsum([o.start_time + o.ttft, *o.itl]) for o in successes])
    chunk_seconds = (chunk_times - first_start).astype(np.int64)
    chunks = np.bincount(chunk_seconds[chunk_seconds < num_seconds], minlength=num_seconds)
    active = np.zeros(num_seconds, dtype=np.int64)
    for outcome in successes:
        start_second = int(outcome.start_time - first_start)
        end_second = int(outcome.start_time + outcome.latency - first_start)
        active[start_second : end_second + 1] += 1
    return float(chunks.max()), int(active.max())


def calculate_metrics(
    outcomes: list[RequestOutcome],
    duration_s: float,
    tokenizer: Any,
    selected_percentile_metrics: list[str],
    selected_percentiles: list[float],
    goodput_config: dict[str, float],
) -> BenchmarkMetrics:
    output_lens: list[int] = []
    total_input = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    # TPOT per request with 0 for single-token outputs, which is what goodput judges (as vLLM does).
    goodput_tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    successes = [o for o in outcomes if o.success]
    for outcome in outcomes:
        if not outcome.success:
            output_lens.append(0)
            continue
        output_len = outcome.output_tokens or len(
            tokenizer(outcome.generated_text, add_special_tokens=False).input_ids
        )
        output_lens.append(output_len)
        total_input += outcome.prompt_len
        tpot = 0.0
        if output_len > 1:
            tpot = (outcome.latency - outcome.ttft) / (output_len - 1)
            tpots.append(tpot)
        goodput_tpots.append(tpot)
        itls.extend(outcome.itl)
        ttfts.append(outcome.ttft)
        e2els.append(outcome.latency)

    request_goodput = None
    if goodput_config:
        per_metric = {"ttft": ttfts, "tpot": goodput_tpots, "e2el": e2els}
        names = list(goodput_config)
        good = sum(
            all(goodput_config[name] / MS_PER_S >= value for name, value in zip(names, values))
            for values in zip(*(per_metric[name] for name in names))
        )
        request_goodput = good / duration_s

    series = {
        "ttft": ttfts,
        "tpot": tpots,
        "itl": itls,
        "e2el": e2els,
        "client_queue_time": [o.queue_time for o in successes],
        "e2el_including_client_queue": [o.latency + o.queue_time for o in successes],
    }
    total_output = sum(output_lens)
    peak_chunks, peak_active = _peak_per_second(successes) if successes else (0.0, 0)
    return BenchmarkMetrics(
        completed=len(successes),
        failed=len(outcomes) - len(successes),
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(successes) / duration_s,
        request_goodput=request_goodput,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        max_output_tokens_per_s=peak_chunks,
        max_concurrent_requests=peak_active,
        output_lens=output_lens,
        stats={
            name: _stats(series[name], selected_percentiles)
            for name in PERCENTILE_METRICS
            if name in selected_percentile_metrics
        },
    )


def _percentile_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def table_row(label: str, value: float | int | str, fmt: str = "") -> str:
    """One line of the printed table: the label padded to 40 columns, then the value."""
    return ("{:<40} {:<10" + fmt + "}").format(label, value)


def table_header(title: str, fill: str = "-") -> str:
    return "{s:{c}^{n}}".format(s=title, n=50, c=fill)


def format_report(
    metrics: BenchmarkMetrics, duration_s: float, max_concurrency: int | None, request_rate: float
) -> str:
    """The table `vllm bench serve` prints, line for line."""
    lines = [table_header(" Serving Benchmark Result ", "=")]

    def row(label: str, value: float | int, fmt: str = "") -> None:
        lines.append(table_row(label, value, fmt))

    row("Successful requests:", metrics.completed)
    row("Failed requests:", metrics.failed)
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    if request_rate != float("inf"):
        row("Request rate configured (RPS):", request_rate, ".2f")
    row("Benchmark duration (s):", duration_s, ".2f")
    row("Total input tokens:", metrics.total_input)
    row("Total generated tokens:", metrics.total_output)
    row("Request throughput (req/s):", metrics.request_throughput, ".2f")
    if metrics.request_goodput is not None:
        row("Request goodput (req/s):", metrics.request_goodput, ".2f")
    row("Output token throughput (tok/s):", metrics.output_throughput, ".2f")
    row("Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s, ".2f")
    row("Peak concurrent requests:", metrics.max_concurrent_requests, ".2f")
    row("Total token throughput (tok/s):", metrics.total_token_throughput, ".2f")
    for name, stats in metrics.stats.items():
        short, header = PERCENTILE_METRICS[name]
        lines.append(table_header(header))
        row(f"Mean {short} (ms):", stats.mean_ms, ".2f")
        row(f"Median {short} (ms):", stats.median_ms, ".2f")
        for p, value in stats.percentiles_ms:
            row(f"P{_percentile_word(p)} {short} (ms):", value, ".2f")
    lines.append("=" * 50)
    return "\n".join(lines)


def result_dict(metrics: BenchmarkMetrics, outcomes: list[RequestOutcome], duration_s: float) -> dict[str, Any]:
    """The measurement part of vLLM's saved result, with its keys in its order."""
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "input_lens": [o.prompt_len for o in outcomes],
        "output_lens": metrics.output_lens,
        "ttfts": [o.ttft for o in outcomes],
        "itls": [o.itl for o in outcomes],
        "latencies": [o.latency for o in outcomes],
        "start_times": [o.start_time for o in outcomes],
        "queue_times": [o.queue_time for o in outcomes],
        "generated_texts": [o.generated_text for o in outcomes],
        "errors": [o.error for o in outcomes],
        "max_output_tokens_per_s": metrics.max_output_tokens_per_s,
        "max_concurrent_requests": metrics.max_concurrent_requests,
        # vLLM's inverse real-time factor for speech benchmarks; always 0 for text.
        "rtfx": 0.0,
    }
    for name, stats in metrics.stats.items():
        result[f"mean_{name}_ms"] = stats.mean_ms
        result[f"median_{name}_ms"] = stats.median_ms
        result[f"std_{name}_ms"] = stats.std_ms
        for p, value in stats.percentiles_ms:
            result[f"p{_percentile_word(p)}_{name}_ms"] = value
    return result
