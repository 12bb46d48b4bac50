"""LoRAAdapters: the served model's names, its base and each LoRA adapter, as clients put them in "model".

The frontend owns the only registry: a name maps to a `LoRARequest` (name, a fresh id per load, folder) that
rides on each request's sampling params, so loading and unloading at run time (POST /v1/load_lora_adapter,
/v1/unload_lora_adapter, vLLM's routes and bodies) tell no other process anything. An adapter is checked before
it is taken (adapter_files.py, against the linears the workers reported with their sizes): a bad one is a 400
naming the cause. A runtime load must name a folder under --lora-allowed-dirs (none: runtime loading is off).
Requests already running with an unloaded adapter finish with it. Usage: `lora = adapters.resolve(body.model)`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Mapping
from typing import Any

from rapid_llm.config.lora_config import LoRAConfig
from rapid_llm.frontend.errors import OpenAIError, bad_request
from rapid_llm.lora.adapter_files import AdapterError, check_adapter, read_adapter
from rapid_llm.sampling.lora_request import LoRARequest


def _not_found(name: str, param: str, what: str = "model") -> OpenAIError:
    return OpenAIError(404, f"The {what} `{name}` does not exist.", param=param, code="model_not_found")


class LoRAAdapters:
    def __init__(self, base_name: str, config: LoRAConfig | None = None,
                 targets: Mapping[str, tuple[int, int]] | None = None) -> None:
        self.base_name = base_name
        self.config = config
        self._targets = {name: tuple(sizes) for name, sizes in (targets or {}).items()}
        self._adapters: dict[str, LoRARequest] = {}
        self._created: dict[str, int] = {}
        self._ids = itertools.count(1)
        for module in config.modules if config is not None else ():
            try:
                self._add(module.name, module.path)
            except OpenAIError as error:
                raise ValueError(f"--lora-modules {module.name}={module.path}: {error.message}") from None

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter `model` names; None for the base model (also a missing "model", as vLLM); 404 otherwise."""
        if model is None or model == self.base_name:
            return None
        adapter = self._adapters.get(model)
        if adapter is None:
            raise _not_found(model, "model")
        return adapter

    def model_cards(self) -> list[dict[str, Any]]:
        """/v1/models entries of the adapters (vLLM's shape: `root` the folder, `parent` the base model)."""
        return [{"id": name, "object": "model", "created": self._created[name], "owned_by": "rapid_llm",
                 "root": adapter.lora_path, "parent": self.base_name} for name, adapter in self._adapters.items()]

    async def load(self, name: str, path: str) -> LoRARequest:
        """POST /v1/load_lora_adapter: check and register an adapter from under --lora-allowed-dirs."""
        config = self._enabled()
        if not config.allowed_dirs:
            raise bad_request("loading adapters at run time is off: start the server with --lora-allowed-dirs DIR",
                              param="lora_path")
        real = os.path.realpath(path)
        if not any(os.path.commonpath([real, allowed]) == allowed for allowed in config.allowed_dirs):
            raise bad_request(f"lora_path {path} is outside --lora-allowed-dirs", param="lora_path")
        return await asyncio.to_thread(self._add, name, real)

    def unload(self, name: str) -> None:
        """POST /v1/unload_lora_adapter: new requests can no longer name it; running ones finish with it."""
        self._enabled()
        if self._adapters.pop(name, None) is None:
            raise _not_found(name, "lora_name", "LoRA adapter")
        del self._created[name]

    def _enabled(self) -> LoRAConfig:
        if self.config is None:
            raise bad_request("this server was started without --enable-lora")
        return self.config

    def _add(self, name: str, path: str) -> LoRARequest:
        if not name:
            raise bad_request("lora_name must not be empty", param="lora_name")
        if name == self.base_name or name in self._adapters:
            raise bad_request(f"The lora adapter `{name}` has already been loaded.", param="lora_name")
        try:
            check_adapter(read_adapter(path), self._targets, self._enabled().max_lora_rank)
        except AdapterError as error:
            raise bad_request(str(error), param="lora_path") from None
        # A re-check: another load of the same name may have finished while this one read its files.
        if name in self._adapters:
            raise bad_request(f"The lora adapter `{name}` has already been loaded.", param="lora_name")
        adapter = LoRARequest(lora_name=name, lora_int_id=next(self._ids), lora_path=path)
        self._adapters[name] = adapter
        self._created[name] = int(time.time())
        return adapter
