"""Conditions an op implementation declares, parsed once at registration and checked at dispatch.

Kinds: `device` ("cpu"/"cuda" or a list), `sm` (">=9.0": the CUDA device's compute capability;
fails on any other device), `dtype` (a list of "fp32"/"bf16"/"fp16" or full names), `lib` (an
optional module, or a list: a missing one is a skip reason, never an import error), `available` (a
"module:function" string or a callable taking (device_type, dtype) and returning None or a skip reason,
called once per process and key on first selection: a JIT-built extension compiles or loads there, never
at registration; a CPU instruction-set probe answers there) and `predicate`
(a callable on the call's arguments, for shape conditions). A check returns why an implementation
is skipped, or None when it holds. Nothing here imports torch: the launcher parses conditions too.
"""

from __future__ import annotations

import importlib.util
import operator
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from rapid_llm.config.dtypes import dtype_name
from rapid_llm.utils.lazy_import import import_target, is_target

CONDITION_KINDS = ("device", "sm", "dtype", "lib", "available", "predicate")
DEVICE_TYPES = ("cpu", "cuda")
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt,
}
_SM_PATTERN = re.compile(r"\s*(>=|<=|==|>|<)?\s*(\d+)\.(\d+)\s*")


@lru_cache(maxsize=None)
def library_available(module: str) -> bool:
    """Whether `module` can be imported, without importing it (cached: find_spec walks sys.path)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or the name is malformed
        return False


@lru_cache(maxsize=None)
def availability_skip_reason(check: str | Callable[[str, str], str | None], device_type: str,
                             dtype: str) -> str | None:
    """The `available` check's answer for (device_type, dtype), computed once (it may build an extension)."""
    try:
        if isinstance(check, str):
            check = import_target(check)
        return check(device_type, dtype)
    except Exception as error:  # a probe that breaks must skip its implementation, never stop start-up
        return f"its availability check failed: {type(error).__name__}: {error}"


def _as_tuple(value: str | list[str] | tuple[str, ...], kind: str) -> tuple[str, ...]:
    values = (value,) if isinstance(value, str) else tuple(value)
    if not values or not all(isinstance(item, str) for item in values):
        raise ValueError(f"condition {kind!r} takes a name or a non-empty list of names, got {value!r}")
    return values


@dataclass(frozen=True)
class Conditions:
    devices: tuple[str, ...] | None = None
    sm: tuple[str, tuple[int, int]] | None = None  # (comparison, (major, minor))
    dtypes: tuple[str, ...] | None = None  # canonical names ("bfloat16")
    libs: tuple[str, ...] | None = None
    available: str | Callable[[str, str], str | None] | None = None
    predicate: Callable[..., bool] | None = None

    @classmethod
    def parse(cls, conditions: dict[str, Any] | None) -> Conditions:
        """Validate a register_op `conditions` dict; unknown kinds and malformed values raise ValueError."""
        conditions = conditions or {}
        unknown = set(conditions) - set(CONDITION_KINDS)
        if unknown:
            raise ValueError(f"unknown condition kind(s) {sorted(unknown)}; known: {list(CONDITION_KINDS)}")
        devices = sm = dtypes = libs = None
        available = conditions.get("available")
        if available is not None and not callable(available) and not is_target(available):
            raise ValueError(f"condition available={available!r} must be a callable or 'module:function'")
        if "device" in conditions:
            devices = _as_tuple(conditions["device"], "device")
            if set(devices) - set(DEVICE_TYPES):
                raise ValueError(f"condition device={conditions['device']!r}: devices are {list(DEVICE_TYPES)}")
        if "sm" in conditions:
            match = _SM_PATTERN.fullmatch(str(conditions["sm"]))
            if match is None:
                raise ValueError(f"condition sm={conditions['sm']!r} is not a comparison such as '>=9.0'")
            sm = (match.group(1) or "==", (int(match.group(2)), int(match.group(3))))
        if "dtype" in conditions:
            dtypes = tuple(dtype_name(name, "condition dtype") for name in _as_tuple(conditions["dtype"], "dtype"))
        if "lib" in conditions:
            libs = _as_tuple(conditions["lib"], "lib")
        predicate = conditions.get("predicate")
        if predicate is not None and not callable(predicate):
            raise ValueError(f"condition predicate must be callable, got {predicate!r}")
        return cls(devices, sm, dtypes, libs, available, predicate)

    def static_skip_reason(self, device_type: str, dtype: str,
                           capability: Callable[[], tuple[int, int]]) -> str | None:
        """Why the conditions that do not look at the call's shapes fail, or None if they hold.

        `capability` is called only for an `sm` condition on a CUDA device; `available` only once every
        other condition holds (it may compile an extension, which must not happen where it is useless).
        """
        if self.devices is not None and device_type not in self.devices:
            return f"needs device {'/'.join(self.devices)}, the call is on {device_type}"
        if self.dtypes is not None and dtype not in self.dtypes:
            return f"needs dtype {'/'.join(self.dtypes)}, the call is {dtype}"
        if self.sm is not None:
            comparison, wanted = self.sm
            wanted_text = f"sm {comparison}{wanted[0]}.{wanted[1]}"
            if device_type != "cuda":
                return f"{wanted_text} needs a CUDA device, the call is on {device_type}"
            have = capability()
            if not _COMPARISONS[comparison](have, wanted):
                return f"needs {wanted_text}, the device is sm {have[0]}.{have[1]}"
        for lib in self.libs or ():
            if not library_available(lib):
                return f"optional library {lib!r} is not installed"
        if self.available is not None:
            return availability_skip_reason(self.available, device_type, dtype)
        return None
