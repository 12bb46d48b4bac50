"""lazy_exports: a package `__getattr__` that imports each exported name's module on first use.

Packages whose submodules import torch use it, so a process that needs only a torch-free
submodule (the launcher, the scheduler) never pays for the rest.
"""

from __future__ import annotations

from typing import Any, Callable

from rapid_llm.utils.lazy_import import import_target


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], list[str]]:
    """The package's `__getattr__` and `__all__` for `modules` (module path -> the names it exports)."""
    exports = {name: module for module, names in modules.items() for name in names}

    def module_getattr(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return import_target(f"{exports[name]}:{name}")

    return module_getattr, sorted(exports)
