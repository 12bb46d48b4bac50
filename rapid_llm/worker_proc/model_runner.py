"""ModelRunner: one step's scheduled requests in, sampled tokens (and logprobs) out.

It owns the model, the paged KV cache, the sampler and a device-side token pool: row `slot`
holds every token of the request in that slot. Input ids are gathered from the pool and each
sampled token is written back into it on the device, so a plan never has to carry the token
its previous step samples (what lets the scheduler plan one step ahead). The step still ends
by copying the sampled ids to the host (`.tolist()`), which waits for the device. A step is
one flat batch mixing prefills, prefill chunks that continue after cached tokens, and decodes;
only a request whose computed tokens reach the end of what it knows gets a token sampled. Requests
that asked for prompt logprobs get them from the same step's hidden states.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.ipc.messages import PromptLogprobs, TokenLogprobs
from rapid_llm.layers.attention import attention_op_of
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.sampler import Sampler
from rapid_llm.layers.sampling_batch import SamplingBatch, SamplingRequest
from rapid_llm.model_loader import load_model
from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.attention.kv_quant import backend_reads_kv, kv_format
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.sampling import SamplingParams
from rapid_llm.worker_proc.kv_cache import allocate_kv_cache, attention_layers
from rapid_llm.worker_proc.prompt_logprobs import score_prompts

logger = logging.getLogger(__name__)


@dataclass
class ScheduledRequest:
    """One request's share of a step, as the scheduler decided it."""

    request_id: str
    slot: int
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    num_computed_tokens: int
    num_new_tokens: int
    block_table: Sequence[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def end(self) -> int:
        return self.num_computed_tokens + self.num_new_tokens

    @property
    def samples_this_step(self) -> bool:
        return self.end == self.num_tokens


@dataclass
class StepOutput:
    """Sampled tokens of the requests that sampled this step; `rows` index the step's request list."""

    rows: list[int]
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        device_config: DeviceConfig | None = None,
        op_backends: dict[str, str] | None = None,
        max_num_seqs: int = 256,
    ) -> None:
        self.model_config = model_config
        self.cache_config = cache_config
        self.device = (device_config or DeviceConfig()).torch_device
        # Before the model is built: overrides reset every op's cached choice.
        REGISTRY.set_overrides(op_backends or {})
        self.op_choices = REGISTRY.describe(self.device, model_config.dtype_name)
        for name, choice in self.op_choices.items():
            logger.info("op %s: %s (%s)", name, choice["backend"], choice["reason"])
        start = time.perf_counter()
        self.model = load_model(model_config, self.device)
        weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        logger.info("weights: %.2f GiB (%s) on %s in %.2f s", weight_bytes / 2**30, model_config.dtype,
                    self.device, time.perf_counter() - start)
        # One attention op per model ("attention", or "mla_attention" for latent caches): its backend builds
        # the step's metadata once and computes every layer.
        attention_op = attention_op_of(attention_layers(self.model))
        self.backend = self._select_attention(attention_op)
        self.kv_cache = allocate_kv_cache(self.model, model_config, cache_config, self.backend, self.device)
        self.num_blocks = self.kv_cache.num_blocks
        logger.info("KV cache: %d blocks of %d tokens = %d tokens, %.2f GiB", self.num_blocks, cache_config.block_size,
                    self.kv_cache.num_tokens, self.kv_cache.num_bytes / 2**30)
        self.sampler = Sampler()
        # int32 halves the pool; one spare column holds the token sampled at max_model_len - 1.
        self.token_pool = torch.zeros(max_num_seqs, model_config.max_model_len + 1, dtype=torch.int32,
                                      device=self.device)

    def _select_attention(self, attention_op: str) -> object:
        """The registry's attention backend; for a quantized KV cache torch_ref when the chosen one cannot read it
        (triton and the library adapters read only float caches, cpu_paged fp8 but not nvfp4), unless --op-backend
        pinned it."""
        backend = REGISTRY.select(attention_op, self.device, self.model_config.dtype_name).fn
        kv_dtype = self.cache_config.kv_dtype(self.model_config.dtype)
        if not backend_reads_kv(backend, kv_dtype) and attention_op not in REGISTRY.overrides:
            reason = f"the {kv_format(kv_dtype)} KV cache is read by torch_ref only"
            logger.info("op %s: torch_ref (%s)", attention_op, reason)
            self.op_choices[attention_op] = {"backend": "torch_ref", "reason": reason}
            return REGISTRY.implementation(attention_op, "torch_ref", self.device, self.model_config.dtype_name).fn
        return backend

    def add_request(self, slot: int, token_ids: Sequence[int]) -> None:
        """Put a request's known tokens (prompt, plus outputs when resuming) into its pool row."""
        if not 0 <= slot < self.token_pool.shape[0]:
            raise ValueError(f"slot {slot} is outside the token pool (max_num_seqs={self.token_pool.shape[0]})")
        if len(token_ids) > self.model_config.max_model_len:
            raise ValueError(f"{len(token_ids)} tokens exceed max_model_len {self.model_config.max_model_len}")
        self.token_pool[slot, : len(token_ids)] = torch.tensor(token_ids, dtype=torch.int32, device=self.device)

    def check_sampling(self, params: SamplingParams, prompt_token_ids: Sequence[int],
                       output_token_ids: Sequence[int]) -> None:
        """Build this request's sampling row alone, on the CPU: a parameter the batched build cannot
        take then fails this one request when it is added, not a whole step later."""
        request = SamplingRequest(params, prompt_token_ids, output_token_ids, self.model_config.eos_token_ids)
        SamplingBatch.build([request], vocab_size=self.model_config.vocab_size, device=torch.device("cpu"))

    def clear_blocks(self, block_ids: list[int]) -> None:
        """Zero freshly allocated KV blocks (the cache is allocated uninitialised); never prefix-cache hits."""
        if block_ids:
            self.kv_cache.clear_blocks(block_ids)

    def _validate(self, requests: Sequence[ScheduledRequest]) -> None:
        block_size = self.cache_config.block_size
        for request in requests:
            end = request.end
            if request.num_new_tokens < 1 or end > request.num_tokens:
                raise ValueError(f"request {request.request_id}: cannot compute tokens "
                                 f"[{request.num_computed_tokens}, {end}) of {request.num_tokens}")
            if end > self.model_config.max_model_len:
                raise ValueError(f"request {request.request_id}: {end} tokens exceed max_model_len "
                                 f"{self.model_config.max_model_len}")
            if len(request.block_table) * block_size < end:
                raise ValueError(f"request {request.request_id}: {len(request.block_table)} blocks cannot hold "
                                 f"{end} tokens")

    @torch.inference_mode()
    def forward(self, requests: Sequence[ScheduledRequest]) -> torch.Tensor:
        """Run the model over the step's new tokens; returns hidden states [num_tokens, hidden]."""
        self._validate(requests)
        layout = StepLayout(
            query_lens=[r.num_new_tokens for r in requests],
            seq_lens=[r.num_computed_tokens + r.num_new_tokens for r in requests],
            block_tables=[r.block_table for r in requests],
            block_size=self.cache_config.block_size,
        )
        attention = self.backend.build_metadata(layout, self.device)
        slots = torch.tensor([r.slot for r in requests], dtype=torch.int64, device=self.device)
        input_ids = self.token_pool[slots[attention.seq_index], attention.positions].long()
        return self.model(ForwardBatch(input_ids=input_ids, attention=attention))

    @torch.inference_mode()
    def execute(self, requests: Sequence[ScheduledRequest]) -> StepOutput:
        hidden_states = self.forward(requests)
        prompt_logprobs = score_prompts(self.model, hidden_states, requests)
        last_token_index = torch.cumsum(torch.tensor([r.num_new_tokens for r in requests]), 0) - 1
        sampling = [i for i, request in enumerate(requests) if request.samples_this_step]
        if not sampling:
            return StepOutput([], [], [], prompt_logprobs)
        logits = self.model.compute_logits(hidden_states[last_token_index[sampling].to(self.device)])
        sampling_batch = SamplingBatch.build(
            [
                SamplingRequest(
                    params=requests[i].sampling_params,
                    prompt_token_ids=requests[i].prompt_token_ids,
                    output_token_ids=requests[i].output_token_ids,
                    eos_token_ids=self.model_config.eos_token_ids,
                )
                for i in sampling
            ],
            vocab_size=self.model_config.vocab_size,
            device=self.device,
        )
        sampled = self.sampler(logits, sampling_batch)
        rows = [requests[i] for i in sampling]
        self.token_pool[[r.slot for r in rows], [r.end for r in rows]] = sampled.token_ids.to(torch.int32)
        return StepOutput(
            rows=sampling,
            token_ids=sampled.token_ids.tolist(),
            logprobs=_logprobs_per_row(sampled, [requests[i].sampling_params.logprobs for i in sampling]),
            prompt_logprobs=prompt_logprobs,
        )


def _logprobs_per_row(sampled, asked: list[int | None]) -> list[TokenLogprobs | None]:
    if sampled.logprobs is None:
        return [None] * len(asked)
    logprobs = sampled.logprobs.tolist()
    top_ids, top_values = sampled.top_token_ids.tolist(), sampled.top_logprobs.tolist()
    return [
        None if n is None else TokenLogprobs(logprobs[row], top_ids[row][:n], top_values[row][:n])
        for row, n in enumerate(asked)
    ]
