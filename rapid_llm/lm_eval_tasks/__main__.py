"""Print the folder lm-eval's `--include_path` needs for rapid_llm's tasks, or a model's tokenizer folder.

    python -m rapid_llm.lm_eval_tasks                          # this package's folder
    python -m rapid_llm.lm_eval_tasks --tokenizer demo-target  # the packaged demo model's folder

A served model id such as `demo-target` is not a path lm-eval's huggingface tokenizer backend can
load; `--tokenizer` resolves it as the server resolves `--model` (a packaged demo name, else the path).
"""

from __future__ import annotations

import argparse

from rapid_llm.lm_eval_tasks import TASKS_DIR
from rapid_llm.utils.demo_checkpoint import model_dir_or_demo


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m rapid_llm.lm_eval_tasks", description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", metavar="MODEL", default=None,
                        help="Print the checkpoint folder of MODEL (a demo name such as demo-target, or a path) instead.")
    args = parser.parse_args(argv)
    folder = str(TASKS_DIR) if args.tokenizer is None else model_dir_or_demo(args.tokenizer)
    print(folder)
    return folder


if __name__ == "__main__":
    main()
