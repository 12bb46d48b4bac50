"""Engine flags for the offline benchmarks: the server's own flags, so a setting means the same thing here.

Key design choice: the flags are generated from `rapid_llm.server_args.ServerArgs` (minus those that
only make sense for HTTP), and the parsed values go straight to `rapid_llm.LLM(**kwargs)`.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

# HTTP-only settings, and the ones the benchmarks define themselves.
EXCLUDED = frozenset({"model", "tokenizer", "served_model_name", "host", "port", "api_key", "chat_template",
                      "trust_request_chat_template", "max_request_body_size", "shutdown_timeout"})


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    from rapid_llm.server_args import ServerArgs

    ServerArgs.add_cli_args(parser.add_argument_group("engine (rapid_llm backend)"), exclude=EXCLUDED)


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from rapid_llm.server_args import ServerArgs

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs) if f.name not in EXCLUDED}
