"""Cache groups: the model's cache-holding layers grouped by what they keep, each with its backend, memory share
and step metadata (vLLM's KV-cache groups).

Paged groups, one per attention op and KV table, keep KV per token in blocks, with the backend the op registry
selected, and build their metadata once per step from their table's rows; all draw from the scheduler's one pool
of block ids (sliding-window layers mixed with full ones read tables of their own: ops/attention/kv_tables.py).
A worker-side proposer's layers (draft model, MTP) are a paged group too (`add_proposer`): table 0 plus scratch
blocks per slot past the pool; the proposer builds their metadata itself. The state group holds recurrent
layers' per-request state, its snapshots and speculative scratch (worker_proc/state_group.py). Budget: state rows
first (slots, padding, snapshots, scratch per state layer, whatever the context), the paged groups share the rest by
block (a block id costs its distinct tensors' bytes). A model with a state group gets no beam search or CUDA
graphs (state cannot be forked or its step captured yet).
Usage: `groups = CacheGroups.of(model, select, max_num_seqs, dtype, device)`; `groups.add_proposer(layers, n)`;
`kv_cache = groups.allocate(model_config, cache_config)`; per step `groups.build_metadata(layouts, slots, ...)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from rapid_llm.config import CacheConfig, ModelConfig
from rapid_llm.distributed.parallel_state import get_pcp_size
from rapid_llm.layers.attention import PagedAttentionLayer
from rapid_llm.layers.state_layer import STATE_GROUP, StateLayer
from rapid_llm.ops.attention.backend import AttentionMetadata, StepLayout, build_common_metadata
from rapid_llm.ops.attention.dcp_backend import DecodeContextParallelBackend
from rapid_llm.ops.attention.dcp_mla_backend import DecodeContextParallelMLABackend
from rapid_llm.ops.attention.pcp_backend import PrefillContextParallelBackend, PrefillContextParallelMLABackend
from rapid_llm.ops.attention.kv_quant import backend_reads_kv, kv_format
from rapid_llm.ops.attention.kv_tables import KVTables, kv_tables
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.utils.host_staging import to_device
from rapid_llm.worker_proc.kv_cache import KVCache, allocate_kv_cache
from rapid_llm.worker_proc.state_group import StateGroup

logger = logging.getLogger(__name__)


def select_backend(op: str, device: torch.device, model_config: ModelConfig, cache_config: CacheConfig,
                   op_choices: dict[str, dict[str, str]]) -> Any:
    """The backend serving paged op `op`: `registry_backend`'s, wrapped under prefill context parallelism (each rank
    attends its share of the step's tokens and writes every token's KV)."""
    backend = registry_backend(op, device, model_config, cache_config, op_choices)
    if get_pcp_size() == 1:
        return backend
    # Refused at start for models with other paged ops.
    wrapper = PrefillContextParallelMLABackend if op == "mla_attention" else PrefillContextParallelBackend
    return wrapper(backend)


def registry_backend(op: str, device: torch.device, model_config: ModelConfig, cache_config: CacheConfig,
                     op_choices: dict[str, dict[str, str]]) -> Any:
    """The registry's backend for a paged op; for a quantized KV cache torch_ref when the chosen one cannot read it
    (triton and the library adapters read only float caches, cpu_paged fp8 but not nvfp4), unless --op-backend
    pinned it. `op_choices` (what the worker reports) records the substitution."""
    if cache_config.context_parallel_size > 1:
        # Decode context parallelism: each rank holds a share of every block (refused at start for other ops). The
        # shares are merged by log-sum-exp, which the single-rank backends do not return: a pinned one is skipped.
        reason = f"KV split over {cache_config.context_parallel_size} DCP ranks, each share attended by attention_lse"
        if op in REGISTRY.overrides:
            reason += f" (the pinned {REGISTRY.overrides[op]} returns no log-sum-exp to merge by)"
            logger.warning("op %s: --op-backend %s=%s skipped: %s", op, op, REGISTRY.overrides[op], reason)
        op_choices[op] = {"backend": "decode_context_parallel", "reason": reason}
        return DecodeContextParallelMLABackend() if op == "mla_attention" else DecodeContextParallelBackend()
    backend = REGISTRY.select(op, device, model_config.dtype_name).fn
    kv_dtype = cache_config.kv_dtype(model_config.dtype)
    if not backend_reads_kv(backend, kv_dtype) and op not in REGISTRY.overrides:
        reason = f"the {kv_format(kv_dtype)} KV cache is read by torch_ref only"
        logger.debug("op %s: torch_ref (%s)", op, reason)
        op_choices[op] = {"backend": "torch_ref", "reason": reason}
        return REGISTRY.implementation(op, "torch_ref", device, model_config.dtype_name).fn
    return backend


# The cache group of a worker-side proposer's layers (a draft model's, MTP's).
PROPOSER_GROUP = "proposer"


@dataclass
class PagedGroup:
    op: str  # the attention op of its layers
    layers: list[PagedAttentionLayer]
    backend: Any
    table: int = 0  # the KV table its layers read
    # A proposer's group: its layers read table 0 plus scratch blocks of their own past the pool (per slot), and
    # the proposer builds their metadata from those tables.
    scratch_blocks: int = 0
    proposer: bool = False

    @property
    def name(self) -> str:
        """The op for table 0 (every model without separate tables), else the op and the table."""
        if self.proposer:
            return PROPOSER_GROUP
        return self.op if self.table == 0 else f"{self.op}@{self.table}"


def split_by_table(paged: list[PagedGroup], table_of: dict[int, int]) -> list[PagedGroup]:
    """One paged group per op and KV table (table 0's first); each layer is named into its group."""
    split = [PagedGroup(group.op, members, group.backend, table)
             for group in paged
             for table in sorted({table_of[id(layer)] for layer in group.layers})
             if (members := [layer for layer in group.layers if table_of[id(layer)] == table])]
    split.sort(key=lambda group: group.table)
    for group in split:
        for layer in group.layers:
            layer.cache_group = group.name
    return split


class CacheGroups:
    def __init__(self, paged: list[PagedGroup], tables: KVTables, state: StateGroup | None, max_num_seqs: int,
                 device: torch.device) -> None:
        self.paged = paged
        self.tables = tables
        self.state = state
        self.max_num_seqs = max_num_seqs
        self.device = device

    @classmethod
    def of(cls, model: nn.Module, select: Callable[[str], Any], max_num_seqs: int, dtype: torch.dtype,
           device: torch.device, num_snapshots: int = 0, draft_positions: int = 0) -> CacheGroups:
        """Group `model`'s cache-holding layers: a paged group per attention op (in the order the ops first
        appear, each with `select(op)` as its backend), one state group for the recurrent layers."""
        by_op: dict[str, list[PagedAttentionLayer]] = {}
        state_layers: list[StateLayer] = []
        for module in model.modules():
            if isinstance(module, PagedAttentionLayer):
                by_op.setdefault(module.attention_op, []).append(module)
            elif isinstance(module, StateLayer):
                state_layers.append(module)
        if not by_op and not state_layers:
            raise ValueError(f"{type(model).__name__} has no cache-holding layers (paged attention or recurrent "
                             "state): rapid_llm serves decoder models only")
        paged = [PagedGroup(op, layers, select(op)) for op, layers in by_op.items()]
        layers = [layer for group in paged for layer in group.layers]
        tables = kv_tables([layer.kv_cache_spec(dtype) for layer in layers])
        state = (StateGroup(state_layers, max_num_seqs, num_snapshots, dtype, device, draft_positions)
                 if state_layers else None)
        return cls(split_by_table(paged, dict(zip(map(id, layers), tables.table_of))), tables, state, max_num_seqs,
                   device)

    @property
    def target(self) -> list[PagedGroup]:
        """The model's own paged groups (a proposer's group left out)."""
        return [group for group in self.paged if not group.proposer]

    @property
    def backends(self) -> dict[str, Any]:
        """The backend of each attention op."""
        return {group.op: group.backend for group in self.target}

    @property
    def primary_backend(self) -> Any:
        """The first paged group's backend: what a worker-side proposer builds its metadata with (None: no paged
        group)."""
        return self.paged[0].backend if self.paged else None

    def add_proposer(self, layers: list[PagedAttentionLayer], scratch_blocks: int) -> None:
        """A worker-side proposer's layers become a group: they read the target's table 0 with its ops' backends,
        plus `scratch_blocks` blocks of their own (`check_speculative` has refused a model with several tables)."""
        backends = self.backends
        missing = sorted({layer.attention_op for layer in layers} - set(backends))
        if missing:
            raise ValueError(f"the proposer's layers use {missing}, which the target's layers do not: its step "
                             "metadata comes from the target's backend")
        for op in dict.fromkeys(layer.attention_op for layer in layers):
            members = [layer for layer in layers if layer.attention_op == op]
            self.paged.append(PagedGroup(op, members, backends[op], scratch_blocks=scratch_blocks, proposer=True))
            for layer in members:
                layer.cache_group = PROPOSER_GROUP

    @property
    def num_state_layers(self) -> int:
        return len(self.state.layers) if self.state is not None else 0

    def describe(self) -> str:
        groups = [f"{group.name} ({len(group.layers)} layers, {type(group.backend).__name__}"
                  + (f", {group.scratch_blocks} scratch blocks)" if group.scratch_blocks else ")")
                  for group in self.paged]
        if self.state is not None:
            groups.append(f"{STATE_GROUP} ({len(self.state.layers)} layers, {self.state.num_bytes / 2**20:.2f} MiB)")
        return ", ".join(groups)

    def forget(self, slots: Sequence[int]) -> None:
        """A request left or entered these slots: their state (if the model keeps any) starts afresh."""
        if self.state is not None:
            self.state.forget(slots)

    @property
    def state_bytes(self) -> int:
        """What the state group's rows take (slots, padding row, snapshots; 0 without one)."""
        return self.state.num_bytes if self.state is not None else 0

    @property
    def num_snapshots(self) -> int:
        """State snapshot rows the scheduler may name (0 without a state group)."""
        return self.state.num_snapshots if self.state is not None else 0

    def load_snapshots(self, chunks: Sequence[Any]) -> None:
        """Before a step: chunks starting from a prefix hit take their state from the hit's snapshot."""
        loads = [chunk for chunk in chunks if chunk.state_load >= 0]
        if loads:
            self._snapshot_state().load([chunk.slot for chunk in loads], [chunk.state_load for chunk in loads],
                                        [chunk.num_computed_tokens for chunk in loads])

    def restore_verified(self, slots: np.ndarray, verifying: np.ndarray, num_accepted: torch.Tensor) -> None:
        """After a step sampling `slots` (`num_accepted` per slot): those `verifying` drafts keep the state after
        their accepted drafts. Nothing without a state group."""
        if self.state is not None and verifying.any():
            self.state.restore(slots[verifying].tolist(),
                               num_accepted[to_device([torch.from_numpy(verifying)], self.device)[0]])

    def rewind(self, slot: int, num_tokens: int) -> None:
        """A rollback: the slot's state holds `num_tokens` tokens (what `restore_verified` left)."""
        if self.state is not None:
            self.state.rewind(slot, num_tokens)

    def _snapshot_state(self) -> StateGroup:
        if self.state is None:
            raise ValueError("a chunk names a state snapshot, but this model keeps no recurrent state")
        return self.state

    def check_speculative(self, method: str | None) -> None:
        """Speculative decoding rolls a request back to its verified tokens, which a request's blocks in more than one
        KV table cannot do yet (state can: the layers keep it per draft position)."""
        if method is not None and self.tables.num_tables > 1:
            raise ValueError(
                f"--speculative-config ({method}) is refused for this model: its sliding-window and full-attention "
                f"layers read {self.tables.num_tables} block tables, which speculative rollback does not cut yet; "
                "serve it without --speculative-config")

    def allocate(self, model_config: ModelConfig, cache_config: CacheConfig) -> KVCache:
        """Allocate the state rows first, then every paged group (a proposer's scratch included) from the rest of the
        budget. Without target paged layers blocks cost nothing, so there are enough for every slot's context."""
        reserved = 0
        if self.state is not None:
            self.state.allocate()
            reserved = self.state.num_bytes
        if not self.target and cache_config.num_blocks is None:
            blocks_per_slot = -(-model_config.max_model_len // cache_config.block_size)
            cache_config = replace(cache_config, num_blocks=self.max_num_seqs * blocks_per_slot + 1)
        # The target's layers first, in the order their KV tables were computed over.
        groups = [*self.target, *(group for group in self.paged if group.proposer)]
        layers = [layer for group in groups for layer in group.layers]
        scratch = [group.scratch_blocks for group in groups for _ in group.layers]
        return allocate_kv_cache(layers, self.tables, self.backends, model_config, cache_config, self.device,
                                 reserved, scratch)

    def build_metadata(self, layouts: Sequence[StepLayout], slots: np.ndarray, starts: np.ndarray,
                       query_lens: np.ndarray, num_drafts: np.ndarray,
                       state_saves: Sequence[Sequence[tuple[int, int]]], slots_on_device: torch.Tensor
                       ) -> tuple[AttentionMetadata, dict[str, Any]]:
        """Every group's metadata for one step (`layouts[t]` over KV table t's rows), keyed by group name, and the
        metadata `ForwardBatch.attention` holds (the first paged group's, else the common positions and lengths)."""
        metadata: dict[str, Any] = {group.name: group.backend.build_metadata(layouts[group.table], self.device)
                                    for group in self.target}
        attention = next(iter(metadata.values())) if metadata else build_common_metadata(layouts[0], self.device)
        if self.state is not None:
            metadata[STATE_GROUP] = self.state.build_metadata(slots, starts, query_lens, num_drafts, state_saves,
                                                              slots_on_device, attention)
        return attention, metadata
