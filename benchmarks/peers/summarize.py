"""Print a markdown table from the result files of compare_cpu.sh (one row per system, model, concurrency).

    python benchmarks/peers/summarize.py benchmark-results/cpu-...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _row(path: Path) -> str:
    result = json.loads(path.read_text())
    system, _, rest = path.stem.partition("-")
    model, _, concurrency = rest.rpartition("-c")
    if system == "hf":
        return (f"| transformers (offline, batch {concurrency}) | {model} | {concurrency} | "
                f"{result['output_tokens_per_second']:.1f} | – | – | – |")
    return (f"| {system} | {model} | {concurrency} | {result['output_throughput']:.1f} | "
            f"{result['median_ttft_ms']:.1f} | {result['median_tpot_ms']:.2f} | {result['request_throughput']:.2f} |")


def main(directory: str) -> None:
    print("| system | model | concurrency | output tok/s | median TTFT ms | median TPOT ms | req/s |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(Path(directory).glob("*.json")):
        print(_row(path))


if __name__ == "__main__":
    main(sys.argv[1])
