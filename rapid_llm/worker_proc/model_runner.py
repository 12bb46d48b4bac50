"""ModelRunner: one step's scheduled chunks in, sampled tokens (and logprobs) out, without waiting for the device.

It owns the model, its cache groups (`cache_groups.py`: paged KV, its last block the padding block, and recurrent
state), the sampler and the persistent input batch (`input_batch.py`): every slot's tokens, block table and
sampling row stay on the device, updated by the scheduler's deltas, so a step only gathers rows by slot index.
Sampled tokens are written back into the token pool on the device, so a plan never carries the token its previous
step samples (what lets the scheduler plan one step ahead); nothing reads the device except the sampled ids, whose
copy back `launch` defers (`PendingOutput`), and prompt logprobs. Decode steps can replay CUDA graphs
(`cuda_graphs.py`) and/or run a torch.compile'd forward. A step is one flat batch mixing prefills, prefill chunks
and decodes; only a request whose computed tokens reach the end of what it knows samples (through its grammar
bitmask and logit_bias). A chunk with drafts samples at each of its 1 + k positions and keeps what the rejection
sampler accepts plus one target token (`_sample_speculative`); a worker-side proposer (`drafting.py`) runs after
every step. `step_rows`: per-request values wrapped layers read per token (layers/step_rows.py), e.g. each
token's LoRA adapter slot (`lora`, lora/adapter_slots.py). With two-batch overlap a big step runs as two
micro-batches (`micro_batches.py`) interleaved at their collectives (distributed/micro_batch_overlap.py).
`execute(requests)` runs fully described requests (tests and benchmarks): it brings the rows up to date first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Collection, Protocol, Sequence

import numpy as np
import torch

from rapid_llm.config import CacheConfig, DeviceConfig, ModelConfig
from rapid_llm.config.compilation_config import CompilationConfig
from rapid_llm.config.lora_config import LoRAConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.distributed.ffn_exchange import ATTENTION, afd_role, announce_step
from rapid_llm.distributed.micro_batch_overlap import run_two
from rapid_llm.distributed.parallel_state import get_pcp_rank, get_pcp_size
from rapid_llm.distributed.prefill_context import TokenSplit, gather_step_tokens, split_step
from rapid_llm.distributed.pipeline import (broadcast_sampled, pipeline_stage, recv_from_previous_stage,
                                            send_to_next_stage)
from rapid_llm.ipc.messages import PooledPrompt
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.logit_bias import LogitBias
from rapid_llm.layers.step_rows import StepRows
from rapid_llm.layers.sampler import Sampler, SamplerOutput
from rapid_llm.lora.adapter_slots import AdapterSlots
from rapid_llm.model_loader import load_model
from rapid_llm.models.llama_decode_program import LlamaDecodeProgram, build_decode_program
from rapid_llm.ops.attention import StepLayout
from rapid_llm.ops.attention.backend import build_common_metadata
from rapid_llm.ops.attention.pcp_backend import split_layout
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.sampling import SamplingParams
from rapid_llm.spec_decode.model_proposer import HiddenStateTap, KVBinding, TargetContext
from rapid_llm.spec_decode.registry import build_model_proposer, runs_in_worker
from rapid_llm.spec_decode.rejection_sampler import accept_one_hot
from rapid_llm.structured.manager import StructuredOutputs
from rapid_llm.utils.host_staging import to_device
from rapid_llm.worker_proc.cache_groups import CacheGroups, select_backend
from rapid_llm.worker_proc.cuda_graphs import DecodeBuffers, DecodeGraphs, capture_sizes
from rapid_llm.worker_proc.deferred_output import PendingOutput, StepOutput
from rapid_llm.worker_proc.drafting import Drafting
from rapid_llm.worker_proc.input_batch import InputBatch
from rapid_llm.worker_proc.micro_batches import split_micro_batches
from rapid_llm.worker_proc.prompt_logprobs import score_prompts
from rapid_llm.worker_proc.prompt_pooling import PromptPooling
from rapid_llm.worker_proc.stage_tokens import StageTokens

logger = logging.getLogger(__name__)


class Chunk(Protocol):
    """What a step computes for one slot: tokens [num_computed_tokens, num_computed_tokens + num_new_tokens)."""

    slot: int
    num_computed_tokens: int
    num_new_tokens: int
    draft_token_ids: Sequence[int]  # the last len(draft_token_ids) tokens computed are drafts to verify
    state_load: int  # a state snapshot to start from (a prefix hit of a model with state), else -1
    state_saves: Sequence[tuple[int, int]]  # (position, snapshot): keep the state after `position` tokens


@dataclass
class ScheduledRequest:
    """One request's share of a step, fully described (what `execute` takes)."""

    request_id: str
    slot: int
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    num_computed_tokens: int
    num_new_tokens: int
    block_table: Sequence[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    draft_token_ids: Sequence[int] = ()  # written after output_token_ids by `execute`
    state_load: int = -1
    state_saves: Sequence[tuple[int, int]] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        cache_config: CacheConfig,
        device_config: DeviceConfig | None = None,
        op_backends: dict[str, str] | None = None,
        max_num_seqs: int = 256,
        compilation: CompilationConfig | None = None,
        speculative: SpeculativeConfig | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        self.model_config = model_config
        self.cache_config = cache_config
        self.compilation = compilation or CompilationConfig()
        self.device = (device_config or DeviceConfig()).torch_device
        self.stage = pipeline_stage()  # the model holds this stage's layers (the whole model without stages)
        self.pcp_rank, self.pcp_size = get_pcp_rank(), get_pcp_size()  # prefill context parallelism's share
        self.micro_batch_steps = 0  # steps run as two overlapped micro-batches (two-batch overlap)
        # Attention-FFN disaggregation: the MoE layers run on FFN ranks, told each forward's micro-batch sizes.
        self.ffn_elsewhere = afd_role() == ATTENTION
        # Before the model is built: overrides reset every op's cached choice.
        REGISTRY.set_overrides(op_backends or {})
        self.op_choices = REGISTRY.describe(self.device, model_config.dtype_name)
        for name, choice in self.op_choices.items():
            logger.debug("op %s: %s (%s)", name, choice["backend"], choice["reason"])
        start = time.perf_counter()
        self.model = load_model(model_config, self.device)
        if self.stage.size > 1:
            layers = self.stage.layers(model_config.hf_config.num_hidden_layers)
            logger.info("pipeline stage %d of %d: decoder layers %d-%d", self.stage.rank, self.stage.size,
                        layers.start, layers.stop - 1)
        # As stored after prepare_weights (quantized formats: packed weights plus scales); /server_info reports it.
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        logger.info("weights: %.2f GiB (%s) on %s in %.2f s", self.weight_bytes / 2**30, model_config.dtype,
                    self.device, time.perf_counter() - start)
        # A paged group per attention op, each with its backend (which builds the step's metadata once for all its
        # layers), and a state group for recurrent layers.
        self.cache_groups = CacheGroups.of(
            self.model, lambda op: select_backend(op, self.device, model_config, cache_config, self.op_choices),
            max_num_seqs, model_config.dtype, self.device, cache_config.state_snapshots,
            speculative.num_speculative_tokens + 1 if speculative is not None else 0)
        self.cache_groups.check_speculative(speculative.method if speculative is not None else None)
        self.backend = self.cache_groups.primary_backend
        logger.info("cache groups: %s", self.cache_groups.describe())
        proposer = None
        if speculative is not None and runs_in_worker(speculative.method):
            proposer = build_model_proposer(speculative, TargetContext(self.model, model_config, self.device,
                                                                       cache_config.block_size, self.backend))
            self.weight_bytes += getattr(proposer, "weight_bytes", 0)
        # An explicit --num-kv-blocks counts the blocks requests may use: the padding block comes on top. A
        # memory budget pays for it.
        allocated = cache_config if cache_config.num_blocks is None else replace(cache_config,
                                                                                 num_blocks=cache_config.num_blocks + 1)
        if proposer is not None:
            self.cache_groups.add_proposer(proposer.kv_layers(), proposer.scratch_blocks_per_slot * max_num_seqs)
        self.kv_cache = self.cache_groups.allocate(model_config, allocated)
        if self.kv_cache.num_blocks < 2:
            raise ValueError(f"the KV cache budget holds {self.kv_cache.num_blocks} block: at least 2 are needed, "
                             "one is the padding block; raise --kv-cache-memory or --gpu-memory-utilization")
        # The last block is the padding block: what padded rows (CUDA graph buckets) read and write, and what
        # block tables are padded with. The scheduler hands out only the others.
        self.padding_block = self.kv_cache.num_blocks - 1
        self.num_blocks = self.padding_block
        self.kv_cache.clear_blocks([self.padding_block])
        logger.info("KV cache: %d blocks of %d tokens = %d tokens (+1 padding block), %.2f GiB", self.num_blocks,
                    cache_config.block_size, self.num_tokens, self.kv_cache.num_bytes / 2**30)
        self.sampler = Sampler()
        self.input_batch = InputBatch(max_num_seqs, model_config.max_model_len, cache_config.block_size,
                                      self.padding_block, model_config.vocab_size, model_config.eos_token_ids,
                                      self.device, self.kv_cache.tables.num_tables)
        # Per-request values that wrapped layers read per token (layers/step_rows.py); empty unless a feature adds one.
        self.step_rows = StepRows(max_num_seqs, self.device)
        # Multi-LoRA: the model's linears wrapped to add each token's adapter, read from the step rows.
        self.lora = None if lora is None else AdapterSlots(self.model, lora, self.step_rows, model_config.dtype,
                                                           self.device)
        self.pooling = PromptPooling(max_num_seqs)
        # Pipeline stages before the last record the last stage's tokens as they arrive (stage_tokens.py).
        self.stage_tokens = None if self.stage.is_last else StageTokens(self.input_batch, self.device)
        self.drafting = None
        if proposer is not None:
            proposer.bind_kv(KVBinding(self.kv_cache.num_blocks, self.padding_block, self.kv_cache.num_blocks))
            self.drafting = Drafting(proposer, speculative, self.input_batch,
                                     HiddenStateTap(self.model, proposer.hidden_state_layers))
        self.decode_model = self._decode_model()
        self.decode_graphs = self._capture_decode_graphs(max_num_seqs)

    @property
    def num_tokens(self) -> int:
        """KV-cache tokens the scheduler may use (the padding block excluded)."""
        return self.num_blocks * self.cache_config.block_size

    def _decode_model(self) -> torch.nn.Module | LlamaDecodeProgram:
        """What decode steps run: the model, its torch.compile'd wrapper or, on the CPU, its decode program (all on
        the same weights and buffers)."""
        if self.compilation.enable_torch_compile:
            logger.info("torch.compile (inductor) on for decode steps: the first steps of each new shape compile")
            return torch.compile(self.model, dynamic=True)
        if self.device.type != "cpu" or self.compilation.enforce_eager:
            return self.model
        program, reason = build_decode_program(self.model)
        logger.info("CPU decode program %s: %s", "on" if program is not None else "off", reason)
        return program or self.model

    def _capture_decode_graphs(self, max_num_seqs: int) -> DecodeGraphs | None:
        if self.device.type != "cuda" or self.compilation.enforce_eager:
            return None
        if self.stage.size > 1:
            logger.info("CUDA graphs off: pipeline stages exchange hidden states between the graph's steps")
            return None
        if self.drafting is not None and self.drafting.tap.active:
            logger.info("CUDA graphs off: the proposer reads hidden states of intermediate layers (forward hooks)")
            return None
        if self.cache_groups.state is not None:
            logger.info("CUDA graphs off: %d layers keep per-request recurrent state, whose steps (row resets, token "
                        "loops) are not captured yet", self.cache_groups.num_state_layers)
            return None
        if self.kv_cache.tables.num_tables > 1:
            logger.info("CUDA graphs off: sliding-window and full-attention layers read %d block tables, and the "
                        "decode buffers hold one", self.kv_cache.tables.num_tables)
            return None
        backends = self.cache_groups.backends
        uncaptured = [type(backend).__name__ for backend in backends.values()
                      if not getattr(backend, "supports_cuda_graphs", False)]
        if uncaptured:
            logger.info("CUDA graphs off: the attention backend %s cannot be captured", ", ".join(uncaptured))
            return None
        sizes = capture_sizes(min(self.compilation.cuda_graph_max_bs, max_num_seqs))
        buffers = DecodeBuffers.allocate(sizes[-1], self.input_batch.max_blocks, self.padding_block,
                                         self.cache_config.block_size, self.device)
        graphs = DecodeGraphs(self.decode_model, backends, sizes, buffers, self.model_config.max_model_len)
        graphs.capture()
        return graphs

    # ---- the scheduler's deltas --------------------------------------------------------------------------

    def start_request(self, request_id: str, slot: int, token_ids: Sequence[int], num_prompt_tokens: int,
                      params: SamplingParams) -> None:
        """Fill the slot's row for a new or resumed request; raises (slot left empty) if it cannot be served."""
        self.input_batch.add(slot, request_id, token_ids, num_prompt_tokens, params)
        self.cache_groups.forget([slot])
        if self.lora is not None:
            self.lora.start(slot, params)
        self.step_rows.start(slot, params)
        self.pooling.start(slot, params)
        if self.drafting is not None:
            self.drafting.add(slot, params)

    def release(self, slots: Sequence[int]) -> None:
        self.input_batch.release(slots)
        self.cache_groups.forget(slots)
        self.step_rows.release(slots)
        if self.lora is not None:
            self.lora.release(slots)
        self.pooling.release(slots)
        if self.drafting is not None:
            self.drafting.release(slots)

    def append_blocks(self, slot: int, block_ids: Sequence[int]) -> None:
        self.input_batch.append_blocks(slot, block_ids)

    def rollback(self, slot: int, num_tokens: int, num_blocks: int) -> None:
        """Cut a slot back to its verified tokens and their blocks (speculative decoding's rejected drafts)."""
        self.input_batch.rollback(slot, num_tokens, num_blocks)
        # Its state holds the verified tokens; the last of `num_tokens`, the target's, is not computed yet.
        self.cache_groups.rewind(slot, num_tokens - 1)

    def set_last_tokens(self, slots: Sequence[int], token_ids: Sequence[int]) -> None:
        """The tokens the scheduler chose for these slots (beam search), written as each slot's last."""
        self.input_batch.set_last_tokens(slots, token_ids)

    def write_drafts(self, slots: Sequence[int], drafts: Sequence[Sequence[int]]) -> None:
        self.input_batch.write_drafts(slots, drafts)

    def copy_blocks(self, sources: list[int], targets: list[int]) -> None:
        """Copy whole KV blocks (a beam's copy-on-write)."""
        self.kv_cache.copy_blocks(sources, targets)

    def clear_blocks(self, block_ids: list[int]) -> None:
        """Zero freshly allocated KV blocks (the cache is allocated uninitialised); never prefix-cache hits."""
        if block_ids:
            self.kv_cache.clear_blocks(block_ids)

    def holds_request(self, slot: int) -> bool:
        return self.input_batch.request_ids[slot] is not None

    def request_id(self, slot: int) -> str:
        return self.input_batch.request_ids[slot] or ""

    def samples(self, chunk: Chunk) -> bool:
        """Whether the chunk's computed tokens reach the end of what its slot knows (it samples this step)."""
        return chunk.num_computed_tokens + chunk.num_new_tokens == int(self.input_batch.num_tokens[chunk.slot])

    # ---- steps -----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def launch(self, chunks: Sequence[Chunk], structured: StructuredOutputs | None = None) -> PendingOutput:
        """Run one step over rows that are up to date; the sampled tokens come back through the result.
        `structured`: the worker's grammar state; its bitmask for the sampling rows is filled on the host
        while the device runs the forward."""
        batch = self.input_batch
        slots = np.fromiter((chunk.slot for chunk in chunks), dtype=np.int64, count=len(chunks))
        query_lens = np.fromiter((chunk.num_new_tokens for chunk in chunks), dtype=np.int64, count=len(chunks))
        ends = query_lens + np.fromiter((chunk.num_computed_tokens for chunk in chunks), dtype=np.int64,
                                        count=len(chunks))
        self._validate(slots, query_lens, ends)
        batch.flush_blocks()
        self.cache_groups.load_snapshots(chunks)
        chunk_drafts = np.fromiter((len(chunk.draft_token_ids) for chunk in chunks), dtype=np.int64, count=len(chunks))
        hidden_states = self._forward(slots, query_lens, ends, chunk_drafts, [chunk.state_saves for chunk in chunks])
        if not self.stage.is_last:
            return self._expect_last_stage_samples(slots, ends)
        prompt_logprobs = []
        if batch.wants_prompt_logprobs[slots].any():
            prompt_logprobs = score_prompts(partial(self._logits, hidden_states), self._described(chunks))
        pooled = self.pooling.pool(batch.request_ids, slots, query_lens, ends, batch.num_prompt_tokens, hidden_states)
        samples = np.flatnonzero(ends == batch.num_tokens[slots])
        if not samples.size:
            self._draft(slots, query_lens, ends, hidden_states, samples, samples)
            return PendingOutput([], None, [], prompt_logprobs, pooled=pooled)
        sample_slots = slots[samples]
        token_bitmask = (structured.fill_bitmask(sample_slots.tolist(), self.device)
                         if structured is not None and structured.active else None)
        num_drafts = np.fromiter((len(chunks[row].draft_token_ids) for row in samples.tolist()), dtype=np.int64,
                                 count=samples.size)
        if num_drafts.any():
            return self._sample_speculative(chunks, slots, hidden_states, query_lens, ends, samples, num_drafts,
                                            token_bitmask, prompt_logprobs, pooled)
        last_token_index, slots_on_device, positions = to_device(
            [torch.from_numpy(np.cumsum(query_lens)[samples] - 1), torch.from_numpy(sample_slots),
             torch.from_numpy(ends[samples])], self.device)
        # A decode step samples every token: no gather.
        every_token = samples.size == hidden_states.shape[0]
        logits = self._logits(hidden_states, None if every_token else last_token_index)
        num_outputs = batch.num_tokens[sample_slots] - batch.num_prompt_tokens[sample_slots]
        sampling_batch = batch.sampling.batch(sample_slots, slots_on_device, num_outputs)
        logit_bias = (LogitBias.build([batch.params[slot] for slot in sample_slots.tolist()],
                                      self.model_config.vocab_size, self.device)
                      if batch.has_logit_bias[sample_slots].any() else None)
        sampled = self.sampler(logits, sampling_batch, token_bitmask=token_bitmask, logit_bias=logit_bias)
        # Every rank feeds its token pool from the sampling rank's choice, so random sampling cannot diverge.
        broadcast_sampled(sampled.token_ids)
        batch.record_sampled(sample_slots, slots_on_device, positions, sampled.token_ids)
        drafts = self._draft(slots, query_lens, ends, hidden_states, samples, ends[samples] + 1)
        asked = ([batch.params[slot].logprobs for slot in sample_slots.tolist()]
                 if sampling_batch.max_num_logprobs is not None else [None] * samples.size)
        return PendingOutput(samples.tolist(), sampled, asked, prompt_logprobs, drafts=drafts, pooled=pooled)

    def _expect_last_stage_samples(self, slots: np.ndarray, ends: np.ndarray) -> PendingOutput:
        """A pipeline stage before the last: post the receive of the tokens the last stage samples in this step
        (recorded by `settle` before a later step touches their slots); no logits here and nothing to report."""
        samples = np.flatnonzero(ends == self.input_batch.num_tokens[slots])
        if samples.size:
            self.stage_tokens.expect(slots[samples], ends[samples])
        return PendingOutput([], None, [], [])

    def settle(self, slots: Collection[int]) -> None:
        """Before a step changes or reads these slots: the last stage's tokens for them are recorded (pipeline
        stages before the last; nothing to do elsewhere)."""
        if self.stage_tokens is not None:
            self.stage_tokens.settle(slots)

    def set_draft_after(self, slots: Sequence[int], wanted: Sequence[bool]) -> None:
        """Which of the step's slots the worker-side proposer drafts for after it (nothing without one)."""
        if self.drafting is not None:
            self.drafting.wanted[slots] = wanted

    def _draft(self, slots: np.ndarray, query_lens: np.ndarray, ends: np.ndarray, hidden_states: torch.Tensor,
               samples: np.ndarray, new_lengths: np.ndarray) -> torch.Tensor | None:
        """The worker-side proposer's drafts [sampling rows, k] after this step (None without one)."""
        if self.drafting is None:
            return None
        return self.drafting.propose(slots, ends - query_lens, query_lens, hidden_states, samples, new_lengths)

    def _sample_speculative(self, chunks: Sequence[Chunk], slots: np.ndarray, hidden_states: torch.Tensor,
                            query_lens: np.ndarray, ends: np.ndarray, samples: np.ndarray, num_drafts: np.ndarray,
                            token_bitmask: torch.Tensor | None, prompt_logprobs: list,
                            pooled: list[PooledPrompt]) -> PendingOutput:
        """Sample every sampling row at its last 1 + k positions (k = its drafts, often 0), as if each position
        were a decode step of its own (a seeded row's noise keyed by that token's output index), then keep the
        accepted drafts and one target token per row (`accept_one_hot`; rows whose drafts come with a worker
        proposer's q are redecided by `Drafting.verify`)."""
        batch = self.input_batch
        sample_slots = slots[samples]
        counts = num_drafts + 1
        offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        hidden_rows = np.repeat(np.cumsum(query_lens)[samples] - counts, counts) + offsets
        rows = np.repeat(np.arange(samples.size), counts)
        expanded = np.repeat(sample_slots, counts)
        num_outputs = (np.repeat(batch.num_tokens[sample_slots] - batch.num_prompt_tokens[sample_slots] - num_drafts,
                                 counts) + offsets)
        width = int(num_drafts.max())
        drafts = np.full((samples.size, width), -1, dtype=np.int64)
        for index, row in enumerate(samples.tolist()):
            drafts[index, : num_drafts[index]] = chunks[row].draft_token_ids
        # The first draft's position: where the target's token goes when no draft is accepted.
        first_positions = host_first_positions = ends[samples] - num_drafts
        (hidden_index, expanded_on_device, slots_on_device, rows_on_device, columns, drafts_on_device,
         counts_on_device, first_positions) = to_device(
            [torch.from_numpy(array) for array in
             (hidden_rows, expanded, sample_slots, rows, offsets, drafts, counts, first_positions)], self.device)
        logits = self._logits(hidden_states, hidden_index)
        sampling_batch = batch.sampling.batch(expanded, expanded_on_device, num_outputs)
        logit_bias = (LogitBias.build([batch.params[slot] for slot in expanded.tolist()], self.model_config.vocab_size,
                                      self.device) if batch.has_logit_bias[expanded].any() else None)
        if token_bitmask is not None:
            token_bitmask = token_bitmask.repeat_interleave(counts_on_device, dim=0)
        sampled = self.sampler(logits, sampling_batch, token_bitmask=token_bitmask, logit_bias=logit_bias)
        broadcast_sampled(sampled.token_ids)  # every rank then accepts the same drafts
        # -2 pads the target grid, -1 the drafts: a padded column never matches.
        targets = torch.full((samples.size, width + 1), -2, dtype=torch.int64, device=self.device)
        targets[rows_on_device, columns] = sampled.token_ids
        num_accepted, token_ids = accept_one_hot(targets, drafts_on_device)
        # State layers kept the state after each verified position: each verifying slot takes its accepted one's.
        self.cache_groups.restore_verified(sample_slots, num_drafts > 0, num_accepted)
        if self.drafting is not None:
            self.drafting.verify(logits, sampling_batch, counts, sample_slots, host_first_positions, num_outputs,
                                 drafts_on_device, num_accepted, token_ids)
        # Rows without drafts keep their one sample (and its logprobs: only they may ask for them).
        picked = (torch.cumsum(counts_on_device, dim=0) - counts_on_device) + num_accepted
        kept = SamplerOutput(token_ids, *(None if tensor is None else tensor[picked] for tensor in
                                          (sampled.logprobs, sampled.top_token_ids, sampled.top_logprobs)))
        batch.record_sampled(sample_slots, slots_on_device, first_positions + num_accepted, token_ids)
        # The proposer needs each row's new length on the host: one read of a (speculating rows run lock-step).
        drafts = None if self.drafting is None else self._draft(
            slots, query_lens, ends, hidden_states, samples, host_first_positions + num_accepted.cpu().numpy() + 1)
        asked = ([batch.params[slot].logprobs for slot in sample_slots.tolist()]
                 if sampling_batch.max_num_logprobs is not None else [None] * samples.size)
        return PendingOutput(samples.tolist(), kept, asked, prompt_logprobs, num_accepted, drafts, pooled)

    def _logits(self, hidden_states: torch.Tensor, rows: torch.Tensor | slice | None) -> torch.Tensor:
        """Logits of the step's token `rows` (indices or a slice; None: every token), named to the step rows first
        so a wrapped LM head reads their values."""
        if self.step_rows.active:
            self.step_rows.select_logit_rows(rows)
        return self.model.compute_logits(hidden_states if rows is None else hidden_states[rows])

    def _validate(self, slots: np.ndarray, query_lens: np.ndarray, ends: np.ndarray) -> None:
        """Vectorised over the step; the first bad chunk is named."""
        batch = self.input_batch
        max_len = self.model_config.max_model_len
        checks = (
            ((query_lens < 1) | (ends > batch.num_tokens[slots]), lambda i: f"cannot compute tokens "
             f"[{ends[i] - query_lens[i]}, {ends[i]}) of {batch.num_tokens[slots[i]]}"),
            (ends > max_len, lambda i: f"{ends[i]} tokens exceed max_model_len {max_len}"),
            (batch.num_blocks[slots] * self.cache_config.block_size < ends,
             lambda i: f"{batch.num_blocks[slots[i]]} blocks cannot hold {ends[i]} tokens"),
        )
        for bad, message in checks:
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise ValueError(f"request {batch.request_ids[slots[first]]} (slot {slots[first]}): {message(first)}")

    def _forward(self, slots: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                 num_drafts: np.ndarray | None = None,
                 state_saves: Sequence[Sequence[tuple[int, int]]] = ()) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of the step's new tokens (`num_drafts`: per chunk, the drafts it
        verifies; `state_saves`: per chunk, the state snapshots it keeps; none by default)."""
        decode = int(query_lens.max()) == 1
        # A graph would replay the step rows of its capture: with any column, decodes run eagerly.
        if decode and self.decode_graphs is not None and not self.step_rows.active:
            layouts, slots_on_device = self._layouts(slots, query_lens, seq_lens)
            common = build_common_metadata(layouts[0], self.device)
            tokens = self.input_batch.token_pool[slots_on_device, common.positions].long()
            hidden_states = self.decode_graphs.run(tokens, common)
            if hidden_states is not None:
                return hidden_states
        model = self.decode_model if decode else self.model
        overlap = self.compilation.two_batch_overlap
        if overlap is not None and overlap.splits(int(query_lens.sum()), decode):
            # Models with a state group are refused at start: no drafts or snapshots to split.
            halves = split_micro_batches(query_lens, seq_lens)
            batches = [self._forward_batch(slots[half.rows], half.query_lens, half.seq_lens, None, ())[0]
                       for half in halves]
            self.micro_batch_steps += 1
            if self.ffn_elsewhere:
                announce_step([int(half.query_lens.sum()) for half in halves], self.device)
            return torch.cat(run_two([partial(model, forward_batch) for forward_batch in batches], self.device))
        if self.ffn_elsewhere:
            announce_step([int(query_lens.sum())], self.device)
        forward_batch, split = self._forward_batch(slots, query_lens, seq_lens, num_drafts, state_saves)
        if split is not None:
            return gather_step_tokens(model(forward_batch), split)
        hidden_states = model(forward_batch)
        if not self.stage.is_last:
            send_to_next_stage([hidden_states])
        return hidden_states

    def _layouts(self, slots: np.ndarray, query_lens: np.ndarray,
                 seq_lens: np.ndarray) -> tuple[list[StepLayout], torch.Tensor]:
        """The step's layout over each KV table, and the chunks' slots on the device."""
        batch = self.input_batch
        width = int(batch.num_blocks[slots].max()) or 1
        slots_on_device = to_device([torch.from_numpy(slots)], self.device)[0]
        query_list, seq_list, slot_list = query_lens.tolist(), seq_lens.tolist(), slots.tolist()
        tables = batch.block_tables[:, slots_on_device, :width]
        return [StepLayout(query_list, seq_list, [host[slot] for slot in slot_list], self.cache_config.block_size,
                           block_table=tables[table]) for table, host in enumerate(batch.host_tables)], slots_on_device

    def _forward_batch(self, slots: np.ndarray, query_lens: np.ndarray, seq_lens: np.ndarray,
                       num_drafts: np.ndarray | None, state_saves: Sequence[Sequence[tuple[int, int]]]
                       ) -> tuple[ForwardBatch, TokenSplit | None]:
        """The model's input for these chunks, and this rank's prefill-context-parallel share (None: the whole)."""
        batch = self.input_batch
        layouts, slots_on_device = self._layouts(slots, query_lens, seq_lens)
        split = (split_step(query_lens, seq_lens, self.pcp_rank, self.pcp_size, self.device) if self.pcp_size > 1
                 else None)
        if split is not None:
            layouts = [split_layout(layout, split) for layout in layouts]
        attention, groups = self.cache_groups.build_metadata(
            layouts, slots, seq_lens - query_lens, query_lens,
            np.zeros_like(slots) if num_drafts is None else num_drafts, state_saves or [()] * len(slots),
            slots_on_device)
        seq_index = attention.seq_index if split is None else split.piece_seqs[attention.seq_index]
        input_ids = batch.token_pool[slots_on_device[seq_index], attention.positions].long()
        if self.step_rows.active:
            self.step_rows.begin_step(slots_on_device, seq_index)
        intermediate = None
        if not self.stage.is_first:
            shape = (2, input_ids.shape[0], self.model_config.hf_config.hidden_size)
            intermediate = recv_from_previous_stage(1, shape, self.model_config.dtype, self.device)[0]
        forward_batch = ForwardBatch(input_ids=input_ids, attention=attention, groups=groups, intermediate=intermediate)
        if split is not None:
            forward_batch.token_seq_lens = split.token_seq_lens  # the sequences', not the pieces' lengths
        return forward_batch, split

    def _described(self, chunks: Sequence[Chunk]) -> list[ScheduledRequest]:
        """The step's chunks with their requests' prompts and parameters (for prompt logprobs)."""
        batch = self.input_batch
        return [ScheduledRequest(batch.request_ids[chunk.slot] or "", chunk.slot, batch.prompts[chunk.slot], (),
                                 chunk.num_computed_tokens, chunk.num_new_tokens, (), batch.params[chunk.slot])
                for chunk in chunks]

    # ---- fully described requests (tests, benchmarks) ------------------------------------------------

    def add_request(self, slot: int, token_ids: Sequence[int]) -> None:
        """Put tokens into a slot's pool row (its request is (re)loaded by the next `execute`)."""
        self.input_batch.write_tokens(slot, token_ids)

    def load(self, requests: Sequence[ScheduledRequest]) -> None:
        """Bring each request's row up to date: reloaded when the slot holds another request or another token
        count than the row knows, then extended by the blocks the row lacks. A caller replaying a step (a
        benchmark) leaves the row one sampled token ahead: without penalties, whose counts hold that token, the
        row only forgets it (the pool's first tokens are unchanged)."""
        batch = self.input_batch
        if batch.num_tables > 1:
            raise ValueError("fully described requests carry one block table; this model's sliding-window and "
                             f"full-attention layers read {batch.num_tables}: serve it through the scheduler")
        for request in requests:
            slot, known = request.slot, int(batch.num_tokens[request.slot])
            same = batch.request_ids[slot] == request.request_id
            if same and known > request.num_tokens and not batch.sampling.host_penalty[slot]:
                batch.num_tokens[slot] = known = request.num_tokens
            if not same or known != request.num_tokens:
                batch.add(slot, request.request_id, [*request.prompt_token_ids, *request.output_token_ids],
                          len(request.prompt_token_ids), request.sampling_params)
            batch.append_blocks(slot, request.block_table[int(batch.num_blocks[slot]):])

    @torch.inference_mode()
    def forward(self, requests: Sequence[ScheduledRequest]) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of the requests' new tokens (nothing sampled)."""
        self.load(requests)
        batch = self.input_batch
        slots = np.array([request.slot for request in requests], dtype=np.int64)
        query_lens = np.array([request.num_new_tokens for request in requests], dtype=np.int64)
        ends = query_lens + np.array([request.num_computed_tokens for request in requests], dtype=np.int64)
        self._validate(slots, query_lens, ends)
        batch.flush_blocks()
        return self._forward(slots, query_lens, ends)

    def execute(self, requests: Sequence[ScheduledRequest]) -> StepOutput:
        self.load(requests)
        self.input_batch.write_drafts([request.slot for request in requests],
                                      [request.draft_token_ids for request in requests])
        return self.launch(requests).result()
