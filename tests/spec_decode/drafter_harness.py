"""What the DFlash and DSpark adapter tests share: the stand-in library on sys.path (and out of sys.modules
afterwards), a mock draft checkpoint, and serving through the in-process engine against plain decoding."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.ipc.messages import GenerateRequest
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.model_runner import ModelRunner
from tests.unit.worker_engine import Engine

HERE = Path(__file__).resolve().parent
# Repetitive prompts, so even a poor drafter gets some drafts accepted on a tiny random model.
PROMPTS = [[5, 9, 17, 33, 5, 9, 17, 33, 5, 9], [40, 41, 42, 43, 44, 40, 41], [7, 7, 7, 7, 7, 7]]


def use_library(monkeypatch: pytest.MonkeyPatch, root: str, package: str, module: str | None = None) -> ModuleType:
    """Put the stand-in library under HERE/root first on the path and return its `module` (default: the package),
    imported by name: the stand-ins are not dependencies, so no test names them in an import statement."""
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(HERE / root))
    return importlib.import_module(module or package)


def forget_library(package: str) -> None:
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        del sys.modules[name]


def checkpoint(directory: Path, fields: dict) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(fields))
    return str(directory)


def runner(target: str, speculative: SpeculativeConfig | None) -> ModelRunner:
    config = ModelConfig.from_pretrained(target, dtype="float32", max_model_len=64)
    return ModelRunner(config, CacheConfig(block_size=4, num_blocks=96), DeviceConfig("cpu"), max_num_seqs=4,
                       speculative=speculative)


def serve(model_runner: ModelRunner, speculative: SpeculativeConfig | None, params: SamplingParams):
    engine = Engine(model_runner, speculative=speculative, enable_prefix_caching=False)
    requests = [GenerateRequest(f"r{i}", prompt, params) for i, prompt in enumerate(PROMPTS)]
    outcomes = engine.serve(requests, depth=2)
    stats = engine.scheduler.stats()
    assert stats.kv_blocks_used == 0
    return [outcome["token_ids"] for outcome in outcomes.values()], stats


GREEDY = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, seed=4, max_tokens=14, ignore_eos=True)
