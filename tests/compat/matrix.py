"""Run the whole compatibility matrix and write docs/compatibility.md (the only way that page is made).

    python -m tests.compat.matrix --write docs/compatibility.md
    python -m tests.compat.matrix --only chunked_prefill+preemption --only dtype   # a few cells, printed

The checkpoints are tiny random ones built in a temporary directory on first use, one per architecture a cell
runs on (the Llama; the Qwen3.5 for the hybrid model), nothing downloaded. The
exit status is 1 when any cell failed, so the full run can gate a release as the CI subset gates a merge.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
from tests.compat.features import FEATURES
from tests.compat.harness import CheckpointSource, Combination, run_matrix
from tests.compat.report import render

REPO_ROOT = Path(__file__).resolve().parents[2]


def parse_combination(text: str) -> Combination:
    """"a+b" -> the features a and b on, in FEATURES order ("baseline" -> none)."""
    names = set() if text == "baseline" else set(text.split("+"))
    known = [feature.name for feature in FEATURES]
    if unknown := names - set(known):
        raise argparse.ArgumentTypeError(f"unknown features {sorted(unknown)}; known: {', '.join(known)}")
    return tuple(name for name in known if name in names)


def tiny_checkpoints(directory: Path) -> CheckpointSource:
    """Each architecture's tiny random float32 checkpoint (with config overrides: a variant of it), built under
    `directory` when first asked for."""
    def build(architecture: str, **overrides: object) -> Path:
        name = "-".join([architecture, *(f"{key}={value}" for key, value in sorted(overrides.items()))])
        return build_tiny_checkpoint(directory / name, architecture, torch.float32, **overrides)

    return functools.cache(build)


def run_facts() -> dict[str, str]:
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    return {"commit": commit, "device": f"{device}, torch {torch.__version__}",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--write", type=Path, default=None, help="Write the page here (only for a full run).")
    parser.add_argument("--only", action="append", type=parse_combination, default=None, metavar="A+B",
                        help="Run only this combination (repeatable; 'baseline' for none on).")
    args = parser.parse_args(argv)
    if args.write is not None and args.only:
        parser.error("--write needs the full matrix; drop --only")
    with tempfile.TemporaryDirectory(prefix="rapid_llm-compat-") as directory:
        results = run_matrix(tiny_checkpoints(Path(directory)), args.only, progress=True)
    if args.write is not None:
        args.write.write_text(render(results, run_facts()))
        print(f"wrote {args.write}")
    failed = [result for result in results if result.status == "failed"]
    print(f"{len(results)} runs: {len(results) - len(failed)} passed or unsupported, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
