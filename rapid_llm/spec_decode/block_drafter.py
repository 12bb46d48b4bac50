"""Shared base of the block-diffusion drafter adapters (DFlash, DSpark): per-slot context of target hidden states.

Both drafters see the request as context features (the target's hidden states of chosen layers, concatenated,
one row per known token) plus a block [anchor, mask, ...] and draft the whole block in one forward. Their
libraries keep the context's K/V in a transformers cache per sequence (batch 1), not in paged blocks, so this
base keeps, per slot, that cache (positions [0, cache_len)) and the features of later positions not yet fed to
it. Features are written truncate-on-write: a chunk starting at position s drops what was stored from s on
(rejected drafts' states), so rollback needs no signal. A slot whose first block changes or whose chunk starts
at 0 starts afresh; a drafting row whose context has a gap (a prefix-cache hit: the target computed no hidden
states there) is an error, never a silent fallback. Subclasses load the library and draft one row:
`_draft(cache, features, anchor_token, anchor_position, limit) -> token ids`. Drafts are the drafter's greedy
choice; sampled requests verify them by the one-hot rule, which is lossless for any draft source.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from abc import abstractmethod
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import torch

from rapid_llm.spec_decode.model_proposer import Drafts, ModelProposer, ProposerStep


def import_library(method: str, module: str, distribution: str, supported: tuple[str, ...],
                   install: str) -> ModuleType:
    """The drafter library, or RuntimeError saying what to install; a version this adapter was not written
    against is refused too (the interface is pinned in docs/spec_decode/)."""
    try:
        library = importlib.import_module(module)
    except ModuleNotFoundError as error:
        raise RuntimeError(f"--speculative-config: method {method!r} needs the {distribution!r} library "
                           f"({install}); it is not installed ({error})") from None
    version = getattr(library, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    if version not in supported:
        raise RuntimeError(f"--speculative-config: method {method!r} supports {distribution} "
                           f"{', '.join(supported)}; {version} is installed")
    return library


def crop_cache(cache, length: int) -> None:
    """Cut a transformers cache to its first `length` positions (transformers 5 crops by a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass
class _SlotContext:
    key: int  # the slot's first block id: a new occupant has another one
    cache: object  # the library's cache of the context [0, cache_len)
    cache_len: int = 0
    features: list[torch.Tensor] = field(default_factory=list)  # positions [cache_len, cache_len + pending)
    pending: int = 0

    def write(self, start: int, rows: torch.Tensor) -> bool:
        """Store features of positions [start, start + len(rows)); False if that leaves a gap."""
        offset = start - self.cache_len
        if offset < 0 or offset > self.pending:
            return False
        if offset < self.pending:
            kept = torch.cat(self.features)[:offset] if self.features else rows[:0]
            self.features, self.pending = ([kept] if offset else []), offset
        self.features.append(rows)
        self.pending += rows.shape[0]
        return True


class BlockDrafter(ModelProposer):
    method = ""
    block_size = 0  # the drafter's block: the anchor plus block_size - 1 drafts

    def __init__(self, config, target) -> None:
        super().__init__(config, target)
        self._contexts: dict[int, _SlotContext | None] = {}

    def check_block(self) -> None:
        if self.config.num_speculative_tokens > self.block_size - 1:
            raise ValueError(f"--speculative-config: num_speculative_tokens {self.config.num_speculative_tokens} "
                             f"exceeds what a {self.method} block of {self.block_size} drafts "
                             f"({self.block_size - 1})")

    @abstractmethod
    def new_cache(self) -> object:
        """An empty per-sequence cache of the library."""

    @abstractmethod
    def draft(self, cache: object, features: torch.Tensor, anchor_token: int, anchor_position: int,
              limit: int) -> list[int]:
        """Feed `features` ([n, layers x hidden], positions anchor_position - n ...) into `cache`, draft up to
        `limit` tokens after the anchor, and leave `cache` holding exactly the context [0, anchor_position)."""

    @torch.inference_mode()
    def propose(self, step: ProposerStep) -> Drafts:
        layers = [step.hidden_states[layer] for layer in self.hidden_state_layers]
        features = torch.cat(layers, dim=-1)
        ends = np.cumsum(step.query_lens)
        for row, slot in enumerate(step.slots.tolist()):
            start, table = int(step.starts[row]), step.block_tables[row]
            context = self._contexts.get(slot)
            if start == 0 or context is None or not table or context.key != table[0]:
                context = _SlotContext(table[0], self.new_cache()) if start == 0 and table else None
            # A copy: a view would keep the whole step's hidden states alive.
            rows = features[ends[row] - step.query_lens[row] : ends[row]].clone()
            self._contexts[slot] = context if context is not None and context.write(start, rows) else None
        width = int(step.max_drafts.max(initial=0))
        tokens = torch.full((step.draft_rows.size, width), -1, dtype=torch.int64, device=self.target.device)
        for index, row in enumerate(step.draft_rows.tolist()):
            slot, anchor = int(step.slots[row]), int(step.num_tokens[index]) - 1
            context = self._contexts.get(slot)
            if context is None or context.cache_len + context.pending < anchor:
                raise RuntimeError(f"{self.method}: slot {slot} has no target hidden states before position "
                                   f"{anchor} (its prompt was served from the prefix cache, which computes none); "
                                   "serve with --disable-prefix-caching")
            pending = (torch.cat(context.features) if context.features else features[:0])[: anchor - context.cache_len]
            drafted = self.draft(context.cache, pending, int(step.token_pool[slot, anchor]), anchor,
                                 int(step.max_drafts[index]))
            context.cache_len, context.features, context.pending = anchor, [], 0
            if drafted:
                tokens[index, : len(drafted)] = torch.tensor(drafted, dtype=torch.int64)
        return Drafts(tokens, None, np.zeros(step.draft_rows.size, dtype=bool))
