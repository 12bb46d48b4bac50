"""The one table that maps dtype names to torch dtypes.

Every other module names dtypes through this table, so "no hard-coded half precision" is
checkable by grep: the float16 entry below is the only one in the engine.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_ALIASES: dict[str, str] = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                                 "fp16": "float16"}


def dtype_from_name(name: str | torch.dtype, setting: str = "dtype") -> torch.dtype:
    """Resolve a dtype name ("bfloat16", "half", torch.float32, ...); errors name the setting."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"{setting}={name} is not supported; use one of {sorted(DTYPES)}")
        return name
    key = str(name).lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"{setting}={name!r} is not supported; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[key]
