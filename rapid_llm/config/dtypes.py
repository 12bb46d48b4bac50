"""The one table of dtype names; torch dtypes are looked up by these names.

Every other module names dtypes through this table, so "no hard-coded half precision" is
checkable by grep: the float16 entry below is the only one in the engine. Names resolve without
torch (the launcher never imports it); `dtype_from_name` imports torch where a tensor dtype is needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES: tuple[str, ...] = ("float32", "float16", "bfloat16")
DTYPE_ALIASES: dict[str, str] = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                                 "fp16": "float16"}


def dtype_name(name: str | torch.dtype, setting: str = "dtype") -> str:
    """The canonical name of a dtype name ("bfloat16", "half", torch.float32, ...); errors name the setting."""
    key = str(name).lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key in DTYPE_NAMES:
        return key
    if not isinstance(name, str):  # a torch.dtype outside the table
        raise ValueError(f"{setting}={name} is not supported; use one of {sorted(DTYPE_NAMES)}")
    raise ValueError(f"{setting}={name!r} is not supported; use one of {sorted(DTYPE_NAMES)} or 'auto'")


def dtype_from_name(name: str | torch.dtype, setting: str = "dtype") -> torch.dtype:
    """The torch dtype of `name` (see `dtype_name`)."""
    import torch

    return getattr(torch, dtype_name(name, setting))
