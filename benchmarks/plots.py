"""Plots of saved bench_serving.py results: throughput vs concurrency, and TTFT/TPOT vs input length.

    python benchmarks/plots.py --throughput benchmark-results/cpu-20261201-night \\
        --input-length benchmark-results/long-context-20261202 --out docs/images

Reads every result JSON in the given directories and draws one line per system (the result's `label`, e.g.
rapid_llm beside vllm): `throughput_vs_concurrency.png` (output tok/s against --max-concurrency, one panel
per model) and `latency_vs_input_length.png` (median TTFT and median TPOT against the mean input length,
one line per system and concurrency). Nothing is plotted that is not in the files. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

Result = dict[str, Any]


def load_results(directories: list[Path]) -> list[Result]:
    """Every bench_serving result (a JSON with `output_throughput`) in the directories, sorted by file name."""
    results = []
    for directory in directories:
        if not directory.is_dir():
            raise ValueError(f"{directory} is not a directory")
        for path in sorted(directory.glob("*.json")):
            result = json.loads(path.read_text())
            if isinstance(result, dict) and "output_throughput" in result:
                results.append(result)
    if not results:
        raise ValueError(f"no bench_serving results in {', '.join(map(str, directories))}")
    return results


def system(result: Result) -> str:
    return result.get("label") or result["backend"]


def model_name(result: Result) -> str:
    return Path(result["model_id"]).name


def throughput_series(results: list[Result]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """model -> system -> [(concurrency, output tok/s)] sorted by concurrency; runs without a cap are skipped."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.get("max_concurrency"):
            series[model_name(r)][system(r)].append((r["max_concurrency"], r["output_throughput"]))
    return {model: {name: sorted(points) for name, points in by_system.items()} for model, by_system in series.items()}


def latency_series(results: list[Result]) -> dict[str, list[tuple[float, float, float]]]:
    """"system, concurrency N" -> [(mean input tokens, median TTFT ms, median TPOT ms)] sorted by input length."""
    series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in results:
        mean_input = r["total_input_tokens"] / max(r["completed"], 1)
        series[f"{system(r)}, concurrency {r.get('max_concurrency') or 'unbounded'}"].append(
            (mean_input, r["median_ttft_ms"], r["median_tpot_ms"]))
    return {name: sorted(points) for name, points in sorted(series.items())}


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("benchmarks/plots.py needs matplotlib: pip install -e \".[bench]\"") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_throughput(results: list[Result], out: Path) -> Path:
    plt = pyplot()
    series = throughput_series(results)
    if not series:
        raise ValueError("no result has a --max-concurrency to plot throughput against")
    figure, axes = plt.subplots(1, len(series), figsize=(4.5 * len(series), 3.6), squeeze=False)
    for axis, (model, by_system) in zip(axes[0], sorted(series.items())):
        for name, points in sorted(by_system.items()):
            axis.plot([c for c, _ in points], [t for _, t in points], marker="o", label=name)
        axis.set(title=model, xlabel="max concurrency", ylabel="output tokens/s", ylim=(0, None))
        axis.set_xticks(sorted({c for points in by_system.values() for c, _ in points}))
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    path = out / "throughput_vs_concurrency.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_latency(results: list[Result], out: Path) -> Path:
    plt = pyplot()
    figure, (ttft, tpot) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, points in latency_series(results).items():
        lengths = [p[0] for p in points]
        ttft.plot(lengths, [p[1] for p in points], marker="o", label=name)
        tpot.plot(lengths, [p[2] for p in points], marker="o", label=name)
    ttft.set(title="time to first token", xlabel="input tokens", ylabel="median TTFT (ms)", yscale="log")
    tpot.set(title="time per output token", xlabel="input tokens", ylabel="median TPOT (ms)")
    for axis in (ttft, tpot):
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle(", ".join(sorted({model_name(r) for r in results})))
    figure.tight_layout()
    path = out / "latency_vs_input_length.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--throughput", type=Path, nargs="*", default=[],
                        help="Result directories of runs at several --max-concurrency values.")
    parser.add_argument("--input-length", type=Path, nargs="*", default=[],
                        help="Result directories of runs at several input lengths.")
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args(argv)
    if not args.throughput and not args.input_length:
        parser.error("give --throughput and/or --input-length directories")
    args.out.mkdir(parents=True, exist_ok=True)
    written = []
    if args.throughput:
        written.append(plot_throughput(load_results(args.throughput), args.out))
    if args.input_length:
        written.append(plot_latency(load_results(args.input_length), args.out))
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError) as exc:
        sys.exit(f"error: {exc}")
