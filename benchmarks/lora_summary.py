"""A markdown table of a benchmarks/bench_lora.sh run: output tok/s (and median TPOT, TTFT) per case and round, and
each case's mean throughput relative to the base model's mean (the issue's goal: at most 15 % lower with one
adapter, 30 % with 16).

Usage: `python benchmarks/lora_summary.py OUT_DIR > OUT_DIR/summary.md`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

CASES = {"base": "base model, no --enable-lora", "lora0": "--enable-lora, no adapter named",
         "lora1": "1 adapter", "lora4": "4 adapters", "lora16": "16 adapters"}


def results(directory: Path) -> dict[str, list[dict]]:
    """case -> its bench_serving results, by round."""
    found: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(directory.glob("*.json")):
        match = re.fullmatch(r"(base|lora\d+)-r(\d+)\.json", path.name)
        if match is not None:
            found[match.group(1)].append(json.loads(path.read_text()))
    return found


def table(found: dict[str, list[dict]]) -> str:
    mean = {case: sum(r["output_throughput"] for r in runs) / len(runs) for case, runs in found.items()}
    base = mean.get("base")
    lines = ["| case | output tok/s per round | mean | vs base | median TPOT ms | median TTFT ms |",
             "| --- | --- | --- | --- | --- | --- |"]
    for case, label in CASES.items():
        runs = found.get(case)
        if not runs:
            continue
        ratio = f"{mean[case] / base:.3f}" if base else "-"
        cells = [", ".join(f"{run[key]:{form}}" for run in runs)
                 for key, form in (("output_throughput", ".1f"), ("median_tpot_ms", ".1f"), ("median_ttft_ms", ".0f"))]
        lines.append(f"| {label} | {cells[0]} | {mean[case]:.1f} | {ratio} | {cells[1]} | {cells[2]} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    directory = parser.parse_args().directory
    flags = (directory / "cpu_flags.txt").read_text().strip() if (directory / "cpu_flags.txt").is_file() else "?"
    print(f"# Multi-LoRA serving cost ({directory.name})\n\nCPU flags: {flags}\n")
    print(table(results(directory)))


if __name__ == "__main__":
    main()
