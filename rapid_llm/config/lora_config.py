"""LoRAConfig: the multi-LoRA flags (vLLM's names), parsed and checked once, torch-free.

`--enable-lora --lora-modules name=path ... --max-loras N --max-lora-rank R --max-cpu-loras M --lora-allowed-dirs D`.
It rides in `SchedulerConfig`: the scheduler never runs more distinct adapters at once than `max_loras` (the
worker's device slots), the worker sizes those slots and its host tier (`max_cpu_loras`) from it, and the frontend
registers `modules` at start and takes runtime loads only from folders under `allowed_dirs`.
Usage: `config = LoRAConfig.parse(modules=["sql=/adapters/sql"], max_loras=4, max_lora_rank=16)`.
"""

from __future__ import annotations

import os

import msgspec

MAX_RANK_LIMIT = 512  # vLLM's largest supported rank


class LoRAModule(msgspec.Struct, frozen=True):
    name: str
    path: str


class LoRAConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_loras: int = 1  # adapters in device slots: the most distinct adapters one step runs
    max_lora_rank: int = 16  # every slot is padded to it
    max_cpu_loras: int = 1  # adapters kept in host memory (>= max_loras); more are read from disk again
    modules: tuple[LoRAModule, ...] = ()  # served from the start
    allowed_dirs: tuple[str, ...] = ()  # POST /v1/load_lora_adapter takes folders under these only; none: it is off

    @classmethod
    def parse(cls, modules: list[str] | None = None, max_loras: int = 1, max_lora_rank: int = 16,
              max_cpu_loras: int | None = None, allowed_dirs: list[str] | None = None,
              served_model_name: str | None = None) -> "LoRAConfig":
        """Errors name the flag and the fix."""
        if max_loras < 1:
            raise ValueError(f"--max-loras {max_loras} must be at least 1")
        if not 1 <= max_lora_rank <= MAX_RANK_LIMIT:
            raise ValueError(f"--max-lora-rank {max_lora_rank} must be in 1-{MAX_RANK_LIMIT}")
        cpu = max_loras if max_cpu_loras is None else max_cpu_loras
        if cpu < max_loras:
            raise ValueError(f"--max-cpu-loras {cpu} must be at least --max-loras {max_loras} (every adapter in a "
                             "device slot also has its host copy)")
        parsed = tuple(_module(text) for text in modules or ())
        names = [module.name for module in parsed]
        for name in names:
            if names.count(name) > 1 or name == served_model_name:
                raise ValueError(f"--lora-modules: the name {name!r} is given twice or is the served model's name")
        dirs = tuple(os.path.realpath(path) for path in allowed_dirs or ())
        for path in dirs:
            if not os.path.isdir(path):
                raise ValueError(f"--lora-allowed-dirs {path} is not a directory")
        return cls(max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=cpu, modules=parsed,
                   allowed_dirs=dirs)


def _module(text: str) -> LoRAModule:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--lora-modules {text!r}: each adapter is NAME=PATH (a PEFT adapter folder)")
    return LoRAModule(name, os.path.abspath(path))
