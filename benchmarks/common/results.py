"""Result files: `--save-result` writes the result dict as JSON under `--result-dir`/`--result-filename`.

Key design choice: without `--save-detailed` the same per-request arrays are dropped as vLLM drops
them (it keeps `latencies` and `queue_times`), so saved files have vLLM's keys either way.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PER_REQUEST_KEYS = ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors")


def save_result(result: dict[str, Any], args: argparse.Namespace, default_stem: str) -> Path | None:
    """Write `result` (None unless --save-result); the file is `<default_stem>.json` unless named."""
    if not args.save_result:
        return None
    saved = result if args.save_detailed else {k: v for k, v in result.items() if k not in PER_REQUEST_KEYS}
    path = Path(args.result_filename or f"{default_stem}.json")
    if args.result_dir:
        path = Path(args.result_dir) / path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"Result saved to {path}")
    return path
