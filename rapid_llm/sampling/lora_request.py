"""LoRARequest: which LoRA adapter a request runs with, carried on its SamplingParams to the scheduler and workers.

Key design choice: the adapter travels with every request (name, a unique id, its folder), so the scheduler and the
worker ranks keep no registry of their own: a worker loads an id it has not seen from its path, and an adapter
loaded again under the same name gets a new id, so nothing cached for the old weights (device slot, host copy,
prefix-cache blocks) can serve the new ones. The frontend hands out the ids (frontend/lora_adapters.py).
Usage: `SamplingParams(lora=LoRARequest(lora_name="sql", lora_int_id=1, lora_path="/adapters/sql"))`.
"""

from __future__ import annotations

import msgspec


class LoRARequest(msgspec.Struct, frozen=True, kw_only=True):
    lora_name: str  # what clients put in "model"
    lora_int_id: int  # unique per load, >= 1
    lora_path: str  # the PEFT adapter folder (adapter_config.json, adapter_model.safetensors)

    @property
    def cache_key(self) -> str:
        """What keys the prefix cache besides the tokens: blocks computed with this adapter serve only it."""
        return f"lora:{self.lora_int_id}"
