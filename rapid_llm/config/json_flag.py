"""Flags whose value is a JSON object (`--speculative-config`, `--kv-transfer-config`), read into a msgspec Struct.

Key design choice: one reader, so every such flag refuses the same way: bad JSON, a value that is not an object,
and msgspec's messages (unknown field, wrong type, the Struct's own checks) all name the flag.
Usage: `config = convert_json_flag(value, SpeculativeConfig, "--speculative-config")`.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def convert_json_flag(value: str | dict[str, Any], cls: type[T], flag: str) -> T:
    """`value` (the flag's JSON text, or a dict from the offline `LLM`) as `cls`; ValueError naming `flag`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{flag} is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {type(value).__name__}")
    try:
        return msgspec.convert(value, cls)
    except msgspec.ValidationError as error:
        # msgspec names the field ("Object contains unknown field `x`", "... - at `$.num_speculative_tokens`") and
        # passes the messages of __post_init__ through.
        raise ValueError(f"{flag}: {error}") from None
