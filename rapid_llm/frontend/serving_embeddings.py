"""POST /v1/embeddings: texts or token ids in, one pooled, normalised vector each out (OpenAI's shape).

Key design choice: an embedding is a generation request that asks the engine to pool its prompt's final
hidden states (`SamplingParams.pooling`) and samples one token, which is dropped; so embeddings batch with
chat and completions in the same scheduler steps and share the generation path (`Serving.generate`). The
pooling is the checkpoint's (`sampling/pooling.py`). `encoding_format: "base64"` (the OpenAI SDK's default)
packs float32 little-endian, as OpenAI does; vLLM's `normalize: false` returns the raw pooled vector.
Usage: `client.embeddings.create(model=..., input=["a", "b"])`.
"""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from rapid_llm.frontend.errors import bad_request
from rapid_llm.frontend.serving_common import Serving, json_response
from rapid_llm.frontend.sse import CLIENT_CLOSED_REQUEST
from rapid_llm.frontend.serving_completions import prompt_inputs
from rapid_llm.ipc.choice_output import ChoiceOutput
from rapid_llm.sampling import SamplingParams
from rapid_llm.sampling.pooling import checkpoint_pooling, normalized


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[int | str | list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None  # accepted and ignored, as in vLLM
    normalize: bool = True  # vLLM's: false returns the pooled vector as it is

    # What Serving.generate asks of any generation request: embeddings are never streamed nor ranked, nor
    # disaggregated.
    stream = False
    ranks_choices = False
    include_usage = False
    kv_transfer_params = None

    def structured_outputs_params(self) -> tuple[None, None]:
        return None, None


class EmbeddingFormat:
    """Shapes each input's pooled vector as an OpenAI embedding object (Serving.generate's choices)."""

    id_prefix = "embd"
    object_name = "list"
    chunk_object_name = "list"
    response_fields: dict[str, Any] = {}

    def __init__(self, encoding_format: str, normalize: bool) -> None:
        self.encoding_format = encoding_format
        self.normalize = normalize

    def choice(self, index: int, output: ChoiceOutput) -> dict[str, Any]:
        vector = normalized(output.embedding) if self.normalize else output.embedding
        embedding: list[float] | str = vector
        if self.encoding_format == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        return {"object": "embedding", "index": index, "embedding": embedding}

    def chunk_choice(self, index: int, output: ChoiceOutput) -> None:
        return None

    def opening_chunk_choice(self, index: int) -> None:
        return None


async def create_embedding(serving: Serving, request: Request) -> Response:
    body = await serving.parse(request, EmbeddingRequest)
    if body.dimensions is not None:
        raise bad_request("dimensions is not supported: embeddings have the model's hidden size", param="dimensions")
    prompts = await prompt_inputs(serving, body.input, 1, param="input")
    try:
        pooling = checkpoint_pooling(serving.engine.model_path)
    except ValueError as error:
        raise bad_request(str(error), param="model") from None
    # One sampled token ends each request (it is dropped); the prompt must leave room for it.
    engine_prompts = []
    for prompt in prompts:
        max_tokens = serving.resolve_max_tokens(len(prompt.token_ids), 1, "input", "input")
        engine_prompts.append((prompt.token_ids, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                                pooling=pooling)))
    generated = await serving.generate(request, EmbeddingFormat(body.encoding_format, body.normalize), body,
                                       engine_prompts, drop_output=True)
    if not isinstance(generated, dict):  # None (never a stream): the client left, the requests were aborted
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    prompt_tokens = generated["usage"]["prompt_tokens"]
    return json_response({"object": "list", "data": generated["choices"], "model": generated["model"],
                          "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
