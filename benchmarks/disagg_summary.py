"""Markdown tables of a benchmarks/bench_disagg.sh run: the mixed workload per mode and request class (TTFT, TPOT,
ITL percentiles, goodput; each pair a row), and the transfer throughput per link speed.

Usage: `python benchmarks/disagg_summary.py OUT_DIR > OUT_DIR/summary.md`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

MIXED_COLUMNS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "p99_itl_ms", "request_goodput",
                 "request_throughput", "completed")


def mixed_table(directory: Path) -> list[str]:
    lines = ["| class | mode | pair | " + " | ".join(MIXED_COLUMNS) + " |", "|" + "---|" * (len(MIXED_COLUMNS) + 3)]
    for path in sorted(directory.glob("*.json")):
        match = re.fullmatch(r"(decode|long)-(colocated|pd)-(\d+)\.json", path.name)
        if match is None:
            continue
        result = json.loads(path.read_text())
        values = " | ".join(_number(result.get(column)) for column in MIXED_COLUMNS)
        lines.append(f"| {match.group(1)} | {match.group(2)} | {match.group(3)} | {values} |")
    return lines


def transfer_table(directory: Path) -> list[str]:
    lines = ["| link | loads | MB moved | transfer s (sum) | MB/s | median TTFT ms |", "|---|---|---|---|---|---|"]
    for path in sorted(directory.glob("metrics-*.txt"), key=lambda item: _rate_bits(item.stem[8:])):
        rate = path.stem[len("metrics-"):]
        counters = {}
        for line in path.read_text().splitlines():
            name, value = line.rsplit(" ", 1)
            counters[name.split("{")[0].split(":")[1].removesuffix("_total")] = float(value)
        megabytes, seconds = counters.get("kv_transfer_bytes", 0) / 1e6, counters.get("kv_transfer_seconds", 0)
        bench = directory / f"link-{rate}.json"
        ttft = json.loads(bench.read_text()).get("median_ttft_ms") if bench.is_file() else None
        lines.append(f"| {rate} | {counters.get('kv_transfer_loads', 0):.0f} | {megabytes:.1f} | {seconds:.2f} | "
                     f"{megabytes / seconds if seconds else 0:.1f} | {_number(ttft)} |")
    return lines


def _rate_bits(rate: str) -> float:
    match = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate)
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)] if match else 0.0


def _number(value: object) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def main(out: Path) -> None:
    flags = (out / "cpu_flags.txt").read_text().strip() if (out / "cpu_flags.txt").is_file() else "unknown"
    print(f"# Prefill/decode disaggregation, {out.name}\n\nCPU flags: {flags}\n")
    if (out / "mixed").is_dir():
        print("## Mixed workload: colocated (both cores) vs 1P1D (a core each)\n")
        print("\n".join(mixed_table(out / "mixed")) + "\n")
    if (out / "transfer").is_dir():
        print("## KV transfer over a rate-limited veth pair (tbf)\n")
        print("\n".join(transfer_table(out / "transfer")) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
