"""Markdown tables of a benchmarks/bench_disagg.sh run: the mixed workload per mode and request class (TTFT, TPOT,
ITL percentiles, goodput; each pair a row), and the transfer throughput per link speed; `--plot PNG` also draws
them (the mixed workload's p99 TPOT, p99 ITL and median TTFT averaged over pairs; MB/s per link). Needs matplotlib
for the plot only.

Usage: `python benchmarks/disagg_summary.py OUT_DIR [--plot docs/images/disagg.png] > OUT_DIR/summary.md`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

MIXED_COLUMNS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "request_goodput",
                 "request_throughput", "completed")


def mixed_results(directory: Path) -> list[tuple[str, str, str, dict]]:
    """(class, mode, pair, bench_serving result) of every mixed-workload file."""
    found = []
    for path in sorted(directory.glob("*.json")):
        match = re.fullmatch(r"(decode|long)-(colocated|pd)-(\d+)\.json", path.name)
        if match is not None:
            found.append((*match.groups(), json.loads(path.read_text())))
    return found


def mixed_table(directory: Path) -> list[str]:
    lines = ["| class | mode | pair | " + " | ".join(MIXED_COLUMNS) + " |", "|" + "---|" * (len(MIXED_COLUMNS) + 3)]
    for kind, mode, pair, result in mixed_results(directory):
        values = " | ".join(_number(result.get(column)) for column in MIXED_COLUMNS)
        lines.append(f"| {kind} | {mode} | {pair} | {values} |")
    return lines


def transfer_rows(directory: Path) -> list[tuple[str, float, float, float, float | None]]:
    """(link, loads, MB moved, transfer seconds, median TTFT ms) per link speed, slowest first."""
    rows = []
    for path in sorted(directory.glob("metrics-*.txt"), key=lambda item: _rate_bits(item.stem[8:])):
        rate = path.stem[len("metrics-"):]
        counters = {}
        for line in path.read_text().splitlines():
            name, value = line.rsplit(" ", 1)
            counters[name.split("{")[0].split(":")[1].removesuffix("_total")] = float(value)
        bench = directory / f"link-{rate}.json"
        ttft = json.loads(bench.read_text()).get("median_ttft_ms") if bench.is_file() else None
        rows.append((rate, counters.get("kv_transfer_loads", 0), counters.get("kv_transfer_bytes", 0) / 1e6,
                     counters.get("kv_transfer_seconds", 0), ttft))
    return rows


def transfer_table(directory: Path) -> list[str]:
    lines = ["| link | loads | MB moved | transfer s (sum) | MB/s | median TTFT ms |", "|---|---|---|---|---|---|"]
    for rate, loads, megabytes, seconds, ttft in transfer_rows(directory):
        lines.append(f"| {rate} | {loads:.0f} | {megabytes:.1f} | {seconds:.2f} | "
                     f"{megabytes / seconds if seconds else 0:.1f} | {_number(ttft)} |")
    return lines


def plot(out: Path, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (latency, link) = plt.subplots(1, 2, figsize=(11, 4))
    means: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for kind, mode, _, result in mixed_results(out / "mixed"):
        for column in ("p99_tpot_ms", "p99_itl_ms", "median_ttft_ms"):
            means[(kind, mode, column)].append(result[column])
    labels = [f"{kind}\n{column.replace('_ms', '')}" for kind in ("decode", "long")
              for column in ("p99_tpot_ms", "p99_itl_ms", "median_ttft_ms")]
    for offset, mode in ((-0.2, "colocated"), (0.2, "pd")):
        values = [sum(means[(kind, mode, column)]) / max(1, len(means[(kind, mode, column)]))
                  for kind in ("decode", "long") for column in ("p99_tpot_ms", "p99_itl_ms", "median_ttft_ms")]
        latency.bar([index + offset for index in range(len(values))], values, width=0.4,
                    label="colocated (2 cores)" if mode == "colocated" else "1P1D (a core each)")
    latency.set_xticks(range(len(labels)), labels, fontsize=8)
    latency.set_yscale("log")
    latency.set_ylabel("ms (log)")
    latency.set_title("Mixed workload: short decodes while long prompts arrive")
    latency.legend()
    rows = [row for row in transfer_rows(out / "transfer") if row[3]] if (out / "transfer").is_dir() else []
    link.bar([row[0] for row in rows], [row[2] / row[3] for row in rows])
    link.set_ylabel("MB/s")
    link.set_title("KV transfer throughput per link speed (tbf)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _rate_bits(rate: str) -> float:
    match = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)] if match else 0.0


def _number(value: object) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def main(out: Path, plot_path: Path | None) -> None:
    flags = (out / "cpu_flags.txt").read_text().strip() if (out / "cpu_flags.txt").is_file() else "unknown"
    print(f"# Prefill/decode disaggregation, {out.name}\n\nCPU flags: {flags}\n")
    if (out / "mixed").is_dir():
        print("## Mixed workload: colocated (both cores) vs 1P1D (a core each)\n")
        print("\n".join(mixed_table(out / "mixed")) + "\n")
    if (out / "transfer").is_dir():
        print("## KV transfer over a rate-limited veth pair (tbf)\n")
        print("\n".join(transfer_table(out / "transfer")) + "\n")
    if plot_path is not None:
        plot(out, plot_path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a bench_disagg.sh output directory")
    parser.add_argument("--plot", type=Path, help="also draw the results into this PNG")
    arguments = parser.parse_args()
    main(arguments.out, arguments.plot)
