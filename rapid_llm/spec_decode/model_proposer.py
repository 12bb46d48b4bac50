"""The worker-side proposer seam: proposers that need the device, their own KV and/or the target's hidden states.

Contract (the draft model, MTP, DFlash and DSpark implement it; an EAGLE head would too):
* Built once in the worker by `build_model_proposer(config, target)` (`registry.py`), after the target model.
* `kv_layers()`: the proposer's own paged attention layers, a cache group of their own (`CacheGroups.add_proposer`)
  reading the target's block ids (one block count over target + proposer bytes per block), so the scheduler's block
  tables, rollback and prefix cache cover them unchanged; `scratch_blocks_per_slot` extra blocks per slot are
  allocated in the proposer's layers only (ids from `KVBinding.first_scratch_block`) for positions it writes
  past what the scheduler holds (its own autoregressive drafts). Blocks are zeroed/copied in every layer alike.
* `hidden_state_layers`: which target hidden states it reads, as layer indices (i = the residual stream after
  decoder layer i, HF's hidden_states[i + 1]) or `FINAL_LAYER` (the final-normed state `compute_logits` reads).
  The runner hands them over in `ProposerStep.hidden_states` ([step tokens, hidden], the step's chunk order).
  Any index other than FINAL_LAYER is captured by forward hooks (`HiddenStateTap`), so CUDA graphs are off then.
* `propose(step)` runs after the target's step (its sample already in the token pool): it must compute its own
  KV for every token the target computed this step (rows that do not draft included, so every block's proposer
  KV stays valid for prefix-cache hits and preemption), then draft up to `step.max_drafts[i]` tokens after
  each drafting row's new last token. A proposer that reads token ids only may set `catch_up_from_tokens`: it
  is then not called in steps where no row drafts and no chunk computes prompt positions, and a chunk's
  `starts` may reach back to positions it skipped (its `hidden_states` is empty then). It returns `Drafts`
  ([D, k] ids, -1 past a row's drafts, and the draft distributions q for the rows that sample); the runner
  keeps q per slot for the next step's verification.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from rapid_llm.config import ModelConfig
from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.layers.attention import PagedAttentionLayer

FINAL_LAYER = -1


@dataclass
class TargetContext:
    """What a model proposer may read of the target at construction."""

    model: nn.Module
    model_config: ModelConfig
    device: torch.device
    block_size: int
    backend: object  # the attention backend the target uses (its metadata builder serves the proposer too)


@dataclass
class KVBinding:
    """Where the proposer's KV lives once the runner allocated it."""

    num_blocks: int  # block ids shared with the target (the padding block included)
    padding_block: int
    first_scratch_block: int  # this slot's scratch: first_scratch_block + slot * scratch_blocks_per_slot + j


@dataclass
class ProposerStep:
    """One target step, handed to the proposer after sampling. Host arrays index the step's chunks (C) or its
    drafting rows (D, in `draft_rows` order)."""

    slots: np.ndarray  # [C] int64
    starts: np.ndarray  # [C] num_computed_tokens of each chunk
    query_lens: np.ndarray  # [C] tokens the target computed
    block_tables: Sequence[Sequence[int]]  # [C] each slot's block ids (scheduler-held)
    hidden_states: dict[int, torch.Tensor]  # layer (or FINAL_LAYER) -> [sum(query_lens), hidden]
    draft_rows: np.ndarray  # [D] chunk indices of the rows that draft now
    num_tokens: np.ndarray  # [D] tokens each drafting row knows after this step (its new token at num_tokens - 1)
    num_outputs: np.ndarray  # [D] its outputs after this step (the noise counter of its first draft)
    max_drafts: np.ndarray  # [D] drafts wanted (>= 1)
    token_pool: torch.Tensor  # [slots, max_model_len + 1] the runner's token pool (this step's sample included)
    sampling: object  # the runner's SamplingRows: each slot's temperature, top-k/p, seed, ...


@dataclass
class Drafts:
    token_ids: torch.Tensor  # [D, k] int64 on the device, -1 past a row's drafts
    probs: torch.Tensor | None  # [D, k, V] float32 draft distributions q; None when every row is greedy
    sampled: np.ndarray  # [D] bool: the row's drafts were sampled from `probs` (False: greedy argmax)


class ModelProposer(ABC):
    hidden_state_layers: tuple[int, ...] = ()
    scratch_blocks_per_slot: int = 0
    catch_up_from_tokens = False  # its catch-up needs token ids only (see the module docstring)

    def __init__(self, config: SpeculativeConfig, target: TargetContext) -> None:
        self.config = config
        self.target = target
        self.kv: KVBinding | None = None

    def kv_layers(self) -> list[PagedAttentionLayer]:
        """The proposer's own attention layers, allocated beside the target's (none by default)."""
        return []

    def bind_kv(self, binding: KVBinding) -> None:
        self.kv = binding

    @abstractmethod
    def propose(self, step: ProposerStep) -> Drafts:
        """Catch up on the step's tokens, then draft for `step.draft_rows` (see the module docstring)."""


class HiddenStateTap:
    """Forward hooks that keep the residual stream after the chosen decoder layers of the target, per step.

    Decoder layers return (hidden, residual) as the models here fuse the residual into the next norm; the
    layer's output state is their sum. `FINAL_LAYER` is not hooked: the runner passes the forward's result."""

    def __init__(self, model: nn.Module, layers: Sequence[int]) -> None:
        self.captured: dict[int, torch.Tensor] = {}
        wanted = sorted({layer for layer in layers if layer != FINAL_LAYER})
        decoder = getattr(getattr(model, "model", model), "layers", None)
        if wanted and decoder is None:
            raise ValueError(f"{type(model).__name__} has no decoder layer list to export hidden states from")
        for layer in wanted:
            if not 0 <= layer < len(decoder):
                raise ValueError(f"hidden state of layer {layer} asked, the target has {len(decoder)} layers")
            decoder[layer].register_forward_hook(self._hook(layer))
        self.active = bool(wanted)

    def _hook(self, layer: int):
        def keep(module: nn.Module, inputs: object, output: object) -> None:
            hidden, residual = output if isinstance(output, tuple) else (output, None)
            self.captured[layer] = hidden if residual is None else hidden + residual
        return keep

    def take(self, final: torch.Tensor) -> dict[int, torch.Tensor]:
        states, self.captured = {**self.captured, FINAL_LAYER: final}, {}
        return states
