"""Layers that keep per-request recurrent state (Gated DeltaNet, Mamba) beside paged attention layers.

A `StateLayer` declares a `StateSpec`; the worker's state cache group allocates its tensors, each
[max_num_seqs + 1 + snapshots + scratch, *shape]: a row per input-batch slot (the scheduler's slot allocator
allocates them), a padding row, the snapshot rows, then the speculative scratch rows. Each step the group
builds one `StateMetadata` (ops/state_metadata.py) for all state layers, which a layer reads with
`batch.metadata_for(self)`, and zeroes the rows of sequences whose chunk starts at token 0 before the forward: a
layer only reads and updates its sequences' rows, so chunked prefill carries state from chunk to chunk and a
preempted request starts afresh.
State is not per block: prefix hits go through snapshots (worker_proc/state_group.py), speculative decoding
through the state after each token of a chunk that verifies drafts, which a layer keeps where
`StateMetadata.kept` says and the worker restores after the accepted ones; beams are not forked (refused).
Usage: subclass, implement `state_spec(dtype)`; in `forward`, `states = self.bound()`, `metadata =
batch.metadata_for(self)`, and pass both to the layer's state ops.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from rapid_llm.ops.attention.kv_cache_spec import StateSpec

STATE_GROUP = "state"  # the cache group every state layer belongs to


class StateLayer(nn.Module, ABC):
    cache_group = STATE_GROUP

    def __init__(self) -> None:
        super().__init__()
        self.states: tuple[torch.Tensor, ...] | None = None

    @abstractmethod
    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        """What this layer keeps per request, given the model dtype."""

    def bind(self, states: tuple[torch.Tensor, ...]) -> None:
        self.states = states

    def bound(self) -> tuple[torch.Tensor, ...]:
        if self.states is None:
            raise RuntimeError("state layer used before the worker bound it to its state tensors")
        return self.states
