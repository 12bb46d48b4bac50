"""AdapterSlots: a worker's LoRA adapters, in `max_loras` device slots over a host tier of `max_cpu_loras`.

After the model is loaded, every LoRA-capable linear (lora_linear.py), the token embedding and the LM head
(lora_vocab.py) are wrapped and the step rows get a column:
each token's device slot. A request that starts with an adapter takes the slot holding it, or an empty one, or the
least recently used slot no running request holds (its adapter is evicted); the adapter's weights come from the
host tier, or from its folder when the tier does not hold it (LRU beyond `max_cpu_loras`). The scheduler never runs
more distinct adapters than there are slots, so a slot is always free; if not, the request fails, not the engine.
Key design choice: adapters are known by the id each request carries (sampling/lora_request.py), never by a
registry here, so runtime loading and unloading need no message to the workers.
Usage: `slots = AdapterSlots(model, config, step_rows, dtype, device)`; `slots.start(row, params)` before the step
rows' `start`, `slots.release(rows)` when requests leave.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
from safetensors import safe_open
from torch import nn

from rapid_llm.config.lora_config import LoRAConfig
from rapid_llm.layers.step_rows import StepRows
from rapid_llm.lora.adapter_files import BASE_LAYER, WEIGHTS_FILE, check_adapter, module_of, read_adapter
from rapid_llm.lora.lora_linear import LORA_LINEARS, SLOT_COLUMN, LoRALinear, LoRAStep
from rapid_llm.lora.lora_vocab import VOCAB_WRAPPERS, LoRAEmbedding, LoRALMHead
from rapid_llm.models.weight_mapping import checkpoint_name_of
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.lora_request import LoRARequest

logger = logging.getLogger(__name__)
NO_SLOT = -1
Weights = dict[str, tuple[torch.Tensor, torch.Tensor]]  # checkpoint module name -> (A, scaled B), host copies
LoRAModule = LoRALinear | LoRAEmbedding | LoRALMHead


def _wrap_modules(model: nn.Module, step: LoRAStep, config: LoRAConfig, dtype: torch.dtype,
                  device: torch.device) -> dict[str, LoRAModule]:
    """Replace each LoRA-capable module of the model by its wrapper; module name -> wrapper."""
    wrapped: dict[str, LoRAModule] = {}
    for name, module in list(model.named_modules()):
        wrapper_class = LoRALinear if type(module) in LORA_LINEARS else VOCAB_WRAPPERS.get(type(module))
        if wrapper_class is None:
            continue
        parent_name, _, child = name.rpartition(".")
        wrapper = wrapper_class(module, step, config.max_loras, config.max_lora_rank, dtype, device)
        setattr(model.get_submodule(parent_name), child, wrapper)
        wrapped[name] = wrapper
    return wrapped


class AdapterSlots:
    def __init__(self, model: nn.Module, config: LoRAConfig, rows: StepRows, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.config = config
        self.dtype = dtype
        self.step = LoRAStep(rows, config.max_loras)
        stacked = getattr(model, "stacked_params", ())
        # checkpoint module name (as PEFT names it) -> (wrapper, the base's shard id it fills)
        self._shards: dict[str, tuple[LoRAModule, str | int | None]] = {}
        self.targets: dict[str, tuple[int, int]] = {}  # checkpoint module name -> (input, output) features
        for name, wrapper in _wrap_modules(model, self.step, config, dtype, device).items():
            for shard_id, sizes in wrapper.targets().items():
                checkpoint = checkpoint_name_of(f"{name}.weight", shard_id, stacked).removesuffix(".weight")
                self._shards[checkpoint] = (wrapper, shard_id)
                self.targets[checkpoint] = sizes
        self._wrappers = list(dict.fromkeys(wrapper for wrapper, _ in self._shards.values()))
        self._slot_ids: list[int | None] = [None] * config.max_loras  # the adapter id each slot holds
        self._refs = [0] * config.max_loras  # running requests on each slot
        self._last_used = [0] * config.max_loras
        self._clock = 0
        self._row_slots: dict[int, int] = {}  # request row (the scheduler's slot) -> device slot
        self._host: OrderedDict[int, Weights] = OrderedDict()
        rows.add_column(SLOT_COLUMN, self._slot_of, default=NO_SLOT)
        logger.info("LoRA: %d modules take adapters, %d device slots of rank %d, %d host copies",
                    len(self._wrappers), config.max_loras, config.max_lora_rank, config.max_cpu_loras)

    def _slot_of(self, params: SamplingParams) -> int:
        return NO_SLOT if params.lora is None else self._slot_ids.index(params.lora.lora_int_id)

    def start(self, row: int, params: SamplingParams) -> None:
        """Hold a device slot with the request's adapter for as long as it runs in `row`."""
        if params.lora is None:
            return
        slot = self._device_slot(params.lora)
        self._refs[slot] += 1
        self._row_slots[row] = slot
        self.step.active = True

    def release(self, rows: Sequence[int]) -> None:
        for row in rows:
            slot = self._row_slots.pop(row, None)
            if slot is not None:
                self._refs[slot] -= 1
        self.step.active = bool(self._row_slots)

    def _device_slot(self, lora: LoRARequest) -> int:
        self._clock += 1
        if lora.lora_int_id in self._slot_ids:
            slot = self._slot_ids.index(lora.lora_int_id)
        else:
            free = [slot for slot, refs in enumerate(self._refs) if refs == 0]
            if not free:
                raise RuntimeError(f"no LoRA slot is free for adapter {lora.lora_name!r}: every one of the "
                                   f"{self.config.max_loras} is held by running requests")
            # An empty slot first, else the least recently used adapter leaves the device.
            slot = min(free, key=lambda s: (self._slot_ids[s] is not None, self._last_used[s]))
            self._fill(slot, self._host_copy(lora))
            self._slot_ids[slot] = lora.lora_int_id
        self._last_used[slot] = self._clock
        return slot

    def _fill(self, slot: int, weights: Weights) -> None:
        per_wrapper: dict[LoRAModule, dict] = {wrapper: {} for wrapper in self._wrappers}
        for module, pair in weights.items():
            wrapper, shard_id = self._shards[module]
            per_wrapper[wrapper][shard_id] = pair
        for wrapper, pairs in per_wrapper.items():
            wrapper.set_slot(slot, pairs)

    def _host_copy(self, lora: LoRARequest) -> Weights:
        weights = self._host.get(lora.lora_int_id)
        if weights is None:
            weights = self._read(lora)
            self._host[lora.lora_int_id] = weights
            while len(self._host) > self.config.max_cpu_loras:
                self._host.popitem(last=False)
        self._host.move_to_end(lora.lora_int_id)
        return weights

    def _read(self, lora: LoRARequest) -> Weights:
        """The adapter's matrices in the model dtype, its scaling folded into B (in fp32, then cast)."""
        adapter = read_adapter(lora.lora_path)
        check_adapter(adapter, self.targets, self.config.max_lora_rank)
        halves: dict[str, dict[str, torch.Tensor]] = {}
        with safe_open(f"{adapter.path}/{WEIGHTS_FILE}", "pt") as weights:
            for name in weights.keys():
                module, which = module_of(name)
                if which != BASE_LAYER:  # a copy of the base's embedding or head: checked by shape, not read
                    halves.setdefault(module, {})[which] = weights.get_tensor(name)
        logger.info("LoRA adapter %r (id %d) read from %s: rank %d, %d modules", lora.lora_name, lora.lora_int_id,
                    adapter.path, adapter.rank, len(halves))
        return {module: (pair["A"].to(self.dtype),
                         (pair["B"].float() * adapter.scaling).to(self.dtype))
                for module, pair in halves.items()}
