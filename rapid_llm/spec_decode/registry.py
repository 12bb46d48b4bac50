"""Proposer registry: `--speculative-config`'s "method" -> a Proposer class, imported lazily ("module:Class").

Adding a proposer is one file and one line here (or `register_proposer` at run time, e.g. a test's mock).
Methods that are planned but not built are refused with that reason, never a silent fallback.
"""

from __future__ import annotations

import importlib

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.spec_decode.proposer import Proposer

_PROPOSERS: dict[str, str | type[Proposer]] = {
    "ngram": "rapid_llm.spec_decode.ngram:NgramProposer",
}

_NOT_BUILT: dict[str, str] = {
    name: "not built yet (docs/spec_decode/README.md lists what is planned)"
    for name in ("draft_model", "draft", "eagle", "eagle3", "mtp", "medusa", "dflash", "dspark")
}


def register_proposer(method: str, proposer: type[Proposer]) -> None:
    if method in _PROPOSERS:
        raise ValueError(f"speculative method {method!r} is registered already")
    _PROPOSERS[method] = proposer


def check_method(method: str) -> None:
    """Raise ValueError naming the field unless `method` has a proposer."""
    if method in _PROPOSERS:
        return
    if method in _NOT_BUILT:
        raise ValueError(f"--speculative-config: method {method!r} is {_NOT_BUILT[method]}")
    raise ValueError(f"--speculative-config: unknown method {method!r}; known: {', '.join(sorted(_PROPOSERS))}")


def build_proposer(config: SpeculativeConfig) -> Proposer:
    check_method(config.method)
    target = _PROPOSERS[config.method]
    if isinstance(target, str):
        module, _, name = target.partition(":")
        target = getattr(importlib.import_module(module), name)
    return target(config)
