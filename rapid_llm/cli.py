"""The `rapid-llm` console command: `rapid-llm serve MODEL [flags]`, as `vllm serve MODEL` works.

`serve` takes the model as a positional argument (or --model / --model-path) and otherwise exactly
the flags of `python -m rapid_llm.launch_server`, which it runs.
"""

from __future__ import annotations

import sys

import rapid_llm
from rapid_llm.server_args import OneLineErrorParser

COMMANDS = ("serve",)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["serve"]:
        parser = OneLineErrorParser(prog="rapid-llm", description="rapid_llm command line.")
        parser.add_argument("command", choices=COMMANDS, help="serve: serve MODEL over the OpenAI API.")
        parser.add_argument("--version", action="version", version=f"rapid_llm {rapid_llm.__version__}")
        parser.parse_args(argv[:1])
    from rapid_llm.launch_server import run
    from rapid_llm.server_args import ServerArgs

    return run(ServerArgs.from_cli(argv[1:], prog="rapid-llm serve", positional_model=True))


if __name__ == "__main__":
    sys.exit(main())
