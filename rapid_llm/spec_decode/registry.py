"""Proposer registry: `--speculative-config`'s "method" -> a proposer class, imported lazily ("module:Class").

Two tables: scheduler-side `Proposer`s (token ids only, e.g. n-gram) and worker-side `ModelProposer`s (the
device, own KV, target hidden states: `model_proposer.py`). Adding a proposer is one file and one line in
its table (or `register_proposer` / `register_model_proposer` at run time, e.g. a test's mock). Methods that
are planned but not built are refused with that reason, never a silent fallback.
"""

from __future__ import annotations

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.spec_decode.proposer import Proposer
from rapid_llm.utils.lazy_import import import_target

_PROPOSERS: dict[str, str | type[Proposer]] = {
    "ngram": "rapid_llm.spec_decode.ngram:NgramProposer",
}

# "draft" is accepted as an alias of vLLM's "draft_model", "deepseek_mtp" (vLLM's older name) of "mtp".
_MODEL_PROPOSERS: dict[str, str | type] = {
    "draft_model": "rapid_llm.spec_decode.draft_model:DraftModelProposer",
    "draft": "rapid_llm.spec_decode.draft_model:DraftModelProposer",
    "mtp": "rapid_llm.spec_decode.mtp:MTPProposer",
    "deepseek_mtp": "rapid_llm.spec_decode.mtp:MTPProposer",
    "dflash": "rapid_llm.spec_decode.dflash:DFlashProposer",
    "dspark": "rapid_llm.spec_decode.dspark:DSparkProposer",
}

_NOT_BUILT: dict[str, str] = {
    name: "not built yet (docs/spec_decode/README.md lists what is planned)"
    for name in ("eagle", "eagle3", "medusa")
}


def register_proposer(method: str, proposer: type[Proposer]) -> None:
    _register(_PROPOSERS, method, proposer)


def register_model_proposer(method: str, proposer: type) -> None:
    """A worker-side proposer class (a `model_proposer.ModelProposer`)."""
    _register(_MODEL_PROPOSERS, method, proposer)


def _register(table: dict, method: str, proposer: type) -> None:
    if method in _PROPOSERS or method in _MODEL_PROPOSERS:
        raise ValueError(f"speculative method {method!r} is registered already")
    table[method] = proposer


def check_method(method: str) -> None:
    """Raise ValueError naming the field unless `method` has a proposer."""
    if method in _PROPOSERS or method in _MODEL_PROPOSERS:
        return
    if method in _NOT_BUILT:
        raise ValueError(f"--speculative-config: method {method!r} is {_NOT_BUILT[method]}")
    known = ", ".join(sorted({*_PROPOSERS, *_MODEL_PROPOSERS}))
    raise ValueError(f"--speculative-config: unknown method {method!r}; known: {known}")


def runs_in_worker(method: str) -> bool:
    """Whether `method` drafts in the worker (a ModelProposer) rather than in the scheduler."""
    check_method(method)
    return method in _MODEL_PROPOSERS


def build_proposer(config: SpeculativeConfig) -> Proposer:
    check_method(config.method)
    return _load(_PROPOSERS[config.method])(config)


def build_model_proposer(config: SpeculativeConfig, target: object):
    """The worker-side proposer of `config.method` (`target`: a model_proposer.TargetContext)."""
    check_method(config.method)
    return _load(_MODEL_PROPOSERS[config.method])(config, target)


def _load(target: str | type) -> type:
    return import_target(target) if isinstance(target, str) else target
