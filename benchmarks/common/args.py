"""Command-line flags shared by the benchmark scripts (bench_serving, bench_offline_throughput, bench_latency).

Key design choice: flag names and defaults are those of `vllm bench serve` (and SGLang's `--gsp-*`
for the generated-shared-prefix workload), so a command line written for those tools describes the
same workload here.
"""

from __future__ import annotations

import argparse
import json

DATASET_NAMES = ("random", "generated-shared-prefix", "sharegpt", "custom")


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload")
    group.add_argument("--dataset-name", choices=DATASET_NAMES, default="random", help="Workload to send.")
    group.add_argument("--dataset-path", default=None, help="ShareGPT JSON or custom JSONL file.")
    group.add_argument(
        "--num-prompts", type=int, default=1000,
        help="Number of requests (generated-shared-prefix uses groups x prompts per group instead).",
    )
    group.add_argument("--input-len", type=int, default=None, help="Shorthand for --random-input-len.")
    group.add_argument(
        "--output-len", type=int, default=None,
        help="Shorthand for --random-output-len, --sharegpt-output-len and --custom-output-len.",
    )
    group.add_argument("--disable-shuffle", action="store_true", help="Keep dataset files in file order.")
    group.add_argument(
        "--no-oversample", action="store_true",
        help="Send only the dataset's valid samples even when there are fewer than --num-prompts.",
    )

    random_group = parser.add_argument_group("random dataset")
    random_group.add_argument("--random-input-len", type=int, default=1024, help="Input tokens per request.")
    random_group.add_argument("--random-output-len", type=int, default=128, help="Output tokens per request.")
    random_group.add_argument(
        "--random-range-ratio", type=parse_range_ratio, default=0.0,
        help="r in [0, 1): lengths are drawn uniformly from [L*(1-r), L*(1+r)]; "
        'a JSON object {"input": r1, "output": r2} sets input and output separately.',
    )
    random_group.add_argument(
        "--random-prefix-len", type=int, default=0,
        help="Random tokens shared by every prompt, before its own random input tokens.",
    )

    gsp_group = parser.add_argument_group("generated-shared-prefix dataset (SGLang's)")
    gsp_group.add_argument("--gsp-num-groups", type=int, default=64, help="Number of system prompts.")
    gsp_group.add_argument("--gsp-prompts-per-group", type=int, default=16, help="Questions per system prompt.")
    gsp_group.add_argument("--gsp-system-prompt-len", type=int, default=2048, help="System prompt tokens.")
    gsp_group.add_argument("--gsp-question-len", type=int, default=128, help="Question tokens.")
    gsp_group.add_argument("--gsp-output-len", type=int, default=256, help="Output tokens per request.")

    sharegpt_group = parser.add_argument_group("sharegpt dataset")
    sharegpt_group.add_argument(
        "--sharegpt-output-len", type=int, default=None,
        help="Output tokens per request; default: the length of the conversation's reply.",
    )

    custom_group = parser.add_argument_group("custom dataset")
    custom_group.add_argument(
        "--custom-output-len", type=int, default=256,
        help="Output tokens per request; -1: each line's own output_tokens (or output_len) field.",
    )
    custom_group.add_argument(
        "--skip-chat-template", action="store_true",
        help="Send custom prompts as written instead of through the tokenizer's chat template.",
    )


def parse_range_ratio(text: str) -> float | dict[str, float]:
    """`0.3` or `{"input": 0.3, "output": 0.5}`, as vLLM 0.32 reads --random-range-ratio."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a number or a JSON object, got {text!r}")
    return value


def add_result_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("results")
    group.add_argument("--save-result", action="store_true", help="Write the result as JSON.")
    group.add_argument("--result-dir", default=None, help="Directory for the result file (default: cwd).")
    group.add_argument("--result-filename", default=None, help="Result file name (default: derived from the run).")
    group.add_argument(
        "--save-detailed", action="store_true",
        help="Keep per-request arrays (lengths, TTFTs, ITLs, texts, errors) in the saved result.",
    )
    group.add_argument("--disable-tqdm", action="store_true", help="No progress bar.")
    group.add_argument("--seed", type=int, default=0, help="Seed for workloads and arrival times.")
    group.add_argument(
        "--tokenizer", default=None,
        help="Local tokenizer directory (default: the model's path as the server reports it).",
    )
