"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: vLLM's runtime adapter routes, bodies and answers.

Both sit behind the API key (they are under /v1). A load checks the adapter's folder before the name can be
used (lora_adapters.py); an unload takes the name away from new requests. The answers are vLLM's plain-text
lines, so scripts written against vLLM read them unchanged. Usage: routes in app.py.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rapid_llm.frontend.serving_common import Serving

logger = logging.getLogger(__name__)


class LoadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's body has it; the name alone identifies an adapter here


async def load_lora_adapter(serving: Serving, request: Request) -> Response:
    body = await serving.read(request, LoadLoRAAdapterRequest)
    adapter = await serving.adapters.load(body.lora_name, body.lora_path)
    logger.info("LoRA adapter %r loaded from %s (id %d)", adapter.lora_name, adapter.lora_path, adapter.lora_int_id)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


async def unload_lora_adapter(serving: Serving, request: Request) -> Response:
    body = await serving.read(request, UnloadLoRAAdapterRequest)
    serving.adapters.unload(body.lora_name)
    logger.info("LoRA adapter %r unloaded", body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
