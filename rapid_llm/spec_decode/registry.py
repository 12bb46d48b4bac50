"""Proposer registry: `--speculative-config`'s "method" -> a proposer class, imported lazily ("module:Class").

One `utils.registry.Registry` of both kinds: scheduler-side `Proposer`s (token ids only, e.g. n-gram) and
worker-side `ModelProposer`s (the device, own KV, target hidden states: `model_proposer.py`), listed in two
tables. Adding a proposer is one file and one line in its table (or `register_proposer` /
`register_model_proposer` at run time, e.g. a test's mock). Methods that are planned but not built are
refused with that reason, never a silent fallback.
"""

from __future__ import annotations

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.spec_decode.proposer import Proposer
from rapid_llm.utils.registry import Registry

_SCHEDULER_SIDE = {
    "ngram": "rapid_llm.spec_decode.ngram:NgramProposer",
}

# "draft" is accepted as an alias of vLLM's "draft_model", "deepseek_mtp" (vLLM's older name) of "mtp".
_WORKER_SIDE = {
    "draft_model": "rapid_llm.spec_decode.draft_model:DraftModelProposer",
    "draft": "rapid_llm.spec_decode.draft_model:DraftModelProposer",
    "mtp": "rapid_llm.spec_decode.mtp:MTPProposer",
    "deepseek_mtp": "rapid_llm.spec_decode.mtp:MTPProposer",
    "dflash": "rapid_llm.spec_decode.dflash:DFlashProposer",
    "dspark": "rapid_llm.spec_decode.dspark:DSparkProposer",
}

_PROPOSERS: Registry[type] = Registry(
    "method", {**_SCHEDULER_SIDE, **_WORKER_SIDE},
    refused={name: f"--speculative-config: method {name!r} is not built yet (docs/spec_decode/README.md lists "
                   "what is planned)" for name in ("eagle", "eagle3", "medusa")})
_IN_WORKER = set(_WORKER_SIDE)


def register_proposer(method: str, proposer: type[Proposer]) -> None:
    _PROPOSERS.register(method, proposer)


def register_model_proposer(method: str, proposer: type) -> None:
    """A worker-side proposer class (a `model_proposer.ModelProposer`)."""
    _PROPOSERS.register(method, proposer)
    _IN_WORKER.add(method)


def check_method(method: str) -> None:
    """Raise ValueError naming the field unless `method` has a proposer."""
    try:
        _PROPOSERS.check(method)
    except ValueError as error:
        message = str(error)
        raise ValueError(message if message.startswith("--") else f"--speculative-config: {message}") from None


def runs_in_worker(method: str) -> bool:
    """Whether `method` drafts in the worker (a ModelProposer) rather than in the scheduler."""
    check_method(method)
    return method in _IN_WORKER


def build_proposer(config: SpeculativeConfig) -> Proposer:
    if runs_in_worker(config.method):
        raise ValueError(f"speculative method {config.method!r} drafts in the worker (build_model_proposer)")
    return _PROPOSERS.get(config.method)(config)


def build_model_proposer(config: SpeculativeConfig, target: object):
    """The worker-side proposer of `config.method` (`target`: a model_proposer.TargetContext)."""
    if not runs_in_worker(config.method):
        raise ValueError(f"speculative method {config.method!r} drafts in the scheduler (build_proposer)")
    return _PROPOSERS.get(config.method)(config, target)
