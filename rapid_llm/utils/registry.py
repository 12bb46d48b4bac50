"""The one registry helper: names -> entries, each an object or a lazy "module:attribute" target.

The model, speculative-proposer, quantization and op registries are instances of `Registry`: registering a
name twice is an error, an entry given as a target string is imported on first `get` (utils/lazy_import.py),
so a registry loads none of its entries, and a name that is known but refused (planned, or a look-alike that
is not served) raises with its reason instead of "unknown". Torch-free.
Usage: `MODELS = Registry("architecture", {"LlamaForCausalLM": "rapid_llm.models.llama:LlamaForCausalLM"})`;
`MODELS.check(name)`; `MODELS.get(name)`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from rapid_llm.utils.lazy_import import import_target

T = TypeVar("T")


class Registry(Generic[T]):
    """`kind` names what is registered in messages ("architecture", "speculative method", ...)."""

    def __init__(self, kind: str, entries: Mapping[str, T | str] | None = None,
                 refused: Mapping[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = {}
        self._refused = dict(refused or {})  # name -> why it is not served
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry: T | str) -> None:
        """Add `entry` (an object, or a "module:attribute" target imported by `get`) under a new name."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already")
        self._entries[name] = entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def refusal_reason(self, name: str) -> str | None:
        """Why a known-but-refused name is not served; None for any other name."""
        return self._refused.get(name)

    def check(self, name: str) -> None:
        """Raise ValueError unless `name` is registered: its refusal reason, or the names that are."""
        if name in self._entries:
            return
        reason = self._refused.get(name)
        if reason is not None:
            raise ValueError(reason)
        raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> T:
        """The entry for `name` (checked first), its target imported and kept on first use."""
        self.check(name)
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_target(entry)
            self._entries[name] = entry
        return entry
