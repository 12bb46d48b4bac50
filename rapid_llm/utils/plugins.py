"""Out-of-tree plugins: `RAPID_LLM_PLUGINS` names modules every engine process imports at start.

vLLM users know the idea: a plugin module registers what it adds when it is imported -- a model with
`rapid_llm.models.registry.register_model("MyForCausalLM", "my_package.my_model:MyForCausalLM")` -- and the
launcher (the frontend, before it checks the architecture), the scheduler, the detokenizer and every worker rank
(`utils/process.run_child`, before the entry point) import the same list, so all of them know the model before
any resolves it. The variable is a comma-separated list of importable module names; an empty entry is skipped,
a module that cannot be imported is a start-up error naming it. Keep a plugin module torch-free (register by
"module:Class"): the launcher imports it and never imports torch otherwise.
Usage: `load_plugins()` (reads os.environ; importing a module twice runs it once).
"""

from __future__ import annotations

import importlib
import logging
import os

logger = logging.getLogger(__name__)
PLUGINS_ENV = "RAPID_LLM_PLUGINS"


def plugin_modules(value: str) -> list[str]:
    """The module names of a `RAPID_LLM_PLUGINS` value, in order."""
    return [name.strip() for name in value.split(",") if name.strip()]


def load_plugins() -> None:
    """Import every module `RAPID_LLM_PLUGINS` names, in order."""
    names = plugin_modules(os.environ.get(PLUGINS_ENV, ""))
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:
            raise ValueError(f"{PLUGINS_ENV} names {name!r}, which failed to import: {type(error).__name__}: "
                             f"{error}") from error
    if names:
        logger.info("%s: imported %s", PLUGINS_ENV, ", ".join(names))
