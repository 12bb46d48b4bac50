"""The speculative-decoding workloads as bench_serving custom JSONL, from the demo models' held-out text.

    python benchmarks/spec_decode_workloads.py code OUT.jsonl   # A: code completion (greedy)
    python benchmarks/spec_decode_workloads.py open OUT.jsonl   # B: open generation (temperature 1.0)

Key design choice: prompts come only from `tools/demo_model/data/held_out.txt` (CPython files the demo
models never trained on, shipped in the repo), formatted as in training (`#<|file|> path` then the text),
so the workload is fixed by the repository and nothing is downloaded. A: windows of `--prompt-chars`
characters ending at a line break, `--per-file` evenly spaced ones per file long enough; the model is to go
on with the file. B: each file's header and first line, little context to copy from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.demo_model.data import SEPARATOR, load_held_out  # noqa: E402 (after the path set-up)


def code_prompts(files: dict[str, str], prompt_chars: int, per_file: int) -> list[str]:
    """Per file of at least 2 x prompt_chars: `per_file` windows ending at evenly spaced line breaks."""
    prompts = []
    for path, text in sorted(files.items()):
        if len(text) < 2 * prompt_chars:
            continue
        for index in range(1, per_file + 1):
            target = prompt_chars + (len(text) - 2 * prompt_chars) * index // (per_file + 1)
            end = text.rfind("\n", prompt_chars // 2, target) + 1
            if end <= 0:
                continue
            start = text.find("\n", max(0, end - prompt_chars)) + 1 if end > prompt_chars else 0
            prompts.append(SEPARATOR.format(path=path) + text[start:end])
    return prompts


def open_prompts(files: dict[str, str]) -> list[str]:
    """Per non-empty file: its header and first line."""
    return [SEPARATOR.format(path=path) + text.split("\n", 1)[0] + "\n"
            for path, text in sorted(files.items()) if text.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("workload", choices=["code", "open"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--prompt-chars", type=int, default=1200, help="A: characters per prompt window.")
    parser.add_argument("--per-file", type=int, default=4, help="A: windows per long enough file.")
    args = parser.parse_args(argv)
    if args.prompt_chars < 100 or args.per_file < 1:
        parser.error("--prompt-chars must be at least 100 and --per-file at least 1")
    files = load_held_out()
    prompts = code_prompts(files, args.prompt_chars, args.per_file) if args.workload == "code" else open_prompts(files)
    args.out.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts), encoding="utf-8")
    print(f"{len(prompts)} prompts -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
