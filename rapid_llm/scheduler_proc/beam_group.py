"""A beam-search request's live beams on the paged KV cache: who holds which slot and block, and what to fork.

Key design choice: beams share KV blocks through the BlockManager's reference counts. The prompt is
prefilled once (the request's own chunks); each round a child beam takes a reference to every block of its
parent. Full blocks are never written again, so they stay shared; a parent's partial last block is written
by the next step, so the first child takes it over and every other child gets a fresh block that the worker
fills by copying the parent's (copy-on-write, `BlockCopy`) before that step. A parent with no child drops
its references. The group gets its W slots at admission (`restart`) and keeps them until it ends: the first child
continues in its parent's slot (the worker is only told its chosen token, `LastToken`), other children
re-enter a freed slot with their whole token list (`NewRequest`). Usage: `restart(slots)` at each admission,
`start` after the prefill's result,
`plan_step` per step; per result, each beam's logprobs go into `round` and `advance_round` ranks and forks once
every beam's are in; `release` frees everything.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import numpy as np

from rapid_llm.ipc.messages import BeamSequence, BlockCopy, LastToken, NewRequest, ScheduledChunk, TokenLogprobs
from rapid_llm.sampling import SamplingParams
from rapid_llm.scheduler_proc.beam_search import BeamSearch, Continuation
from rapid_llm.scheduler_proc.block_manager import BlockManager


@dataclass
class Beam:
    output_token_ids: list[int]
    cumulative_logprob: np.float32
    slot: int
    block_ids: list[int]  # cover exactly num_computed_tokens
    num_computed_tokens: int
    new_row: bool = False  # enters its slot this step (a NewRequest), instead of continuing its parent's row
    copy_from: int | None = None  # block_ids[-1] is the parent's partial block, to be replaced by a copy


@dataclass
class BeamStep:
    """What one planned step of the group sends to the worker."""

    new_requests: list[NewRequest]
    chunks: list[ScheduledChunk]
    last_tokens: list[LastToken]
    block_copies: list[BlockCopy]


class BeamGroup:
    def __init__(self, params: SamplingParams, max_new_tokens: int, eos_token_ids: tuple[int, ...]) -> None:
        self.search = BeamSearch(params, max_new_tokens, eos_token_ids)
        self.width = self.search.width
        # What the worker runs each beam with: greedy, with enough top logprobs to rank every candidate.
        self.worker_params = msgspec.structs.replace(params, n=1, logprobs=self.search.num_candidates,
                                                     use_beam_search=False, beam_width=None)
        self.slots: list[int] = []  # all W reserved slots
        self.beams: list[Beam] = []
        self.in_flight = False  # a round (`plan_step`) is planned and its result not processed
        # The round in flight's top logprobs by slot, as its result's tokens are taken, until `advance_round`.
        self.round: dict[int, TokenLogprobs | None] = {}
        self._params = params
        self._max_new_tokens = max_new_tokens
        self._eos_token_ids = eos_token_ids

    @property
    def started(self) -> bool:
        return bool(self.beams)

    def block_ids(self) -> Iterator[int]:
        """Every block reference the group holds (a shared block once per holder)."""
        for beam in self.beams:
            yield from beam.block_ids

    def start(self, slot: int, block_ids: list[int], num_prompt_tokens: int) -> None:
        """The prompt is computed in `slot` and `block_ids`: they become the root beam, which has no output yet."""
        self.beams = [Beam([], np.float32(0.0), slot, block_ids, num_prompt_tokens)]

    def advance(self, candidates: list[list[tuple[int, float]]], blocks: BlockManager, block_size: int) -> list[int]:
        """Rank one round (candidates per live beam, in beam order) and fork the next beams; returns the slots
        whose rows are no longer in use (the worker may reset them). Nothing to fork once `search.done`."""
        running = self.search.step([beam.output_token_ids for beam in self.beams],
                                   [beam.cumulative_logprob for beam in self.beams], candidates)
        if self.search.done:
            return []
        return self._fork(running, blocks, block_size)

    def advance_round(self, request_id: str, blocks: BlockManager, block_size: int) -> list[int]:
        """`advance` from one step's result: each live beam's top logprobs, collected by slot in `round`."""
        self.in_flight = False
        by_slot, self.round = self.round, {}
        candidates = []
        for beam in self.beams:
            logprobs = by_slot.get(beam.slot)
            if logprobs is None:
                raise ValueError(f"request {request_id}: beam in slot {beam.slot} got no top logprobs")
            candidates.append(list(zip(logprobs.top_token_ids, logprobs.top_logprobs)))
        return self.advance(candidates, blocks, block_size)

    def best_sequences(self) -> list[BeamSequence]:
        """The finished search's n best beams, best first; never empty: every way a search ends has kept at
        least one hypothesis (beam_search.py)."""
        return [BeamSequence(h.token_ids, float(h.cumulative_logprob), float(h.score), h.finish_reason, h.stop_reason)
                for h in self.search.best()]

    def _fork(self, running: list[Continuation], blocks: BlockManager, block_size: int) -> list[int]:
        parents = self.beams
        has_child = [False] * len(parents)
        children: list[Beam] = []
        for continuation in running:
            parent = parents[continuation.parent]
            outputs = [*parent.output_token_ids, continuation.token_id]
            if not has_child[continuation.parent]:
                # The first child takes its parent's slot and references over.
                has_child[continuation.parent] = True
                children.append(Beam(outputs, continuation.cumulative_logprob, parent.slot, list(parent.block_ids),
                                     parent.num_computed_tokens))
                continue
            blocks.share(parent.block_ids)
            partial = parent.num_computed_tokens % block_size != 0
            children.append(Beam(outputs, continuation.cumulative_logprob, -1, list(parent.block_ids),
                                 parent.num_computed_tokens, new_row=True,
                                 copy_from=parent.block_ids[-1] if partial else None))
        freed_slots = []
        for parent, kept in zip(parents, has_child):
            if not kept:
                blocks.free(reversed(parent.block_ids))
                freed_slots.append(parent.slot)
        in_use = {child.slot for child in children if not child.new_row}
        spare = [slot for slot in self.slots if slot not in in_use]
        for child in children:
            if child.new_row:
                child.slot = spare.pop()
        self.beams = children
        return freed_slots

    def num_blocks_needed(self, block_size: int) -> int:
        """Blocks the next step allocates: copy-on-write targets plus blocks for tokens that start a new one."""
        needed = 0
        for beam in self.beams:
            needed += beam.copy_from is not None
            needed += -(-(beam.num_computed_tokens + 1) // block_size) - len(beam.block_ids)
        return needed

    def plan_step(self, request_id: str, prompt_token_ids: list[int], blocks: BlockManager,
                  block_size: int) -> BeamStep:
        """Allocate the step's blocks (check `num_blocks_needed` first) and describe it: one token per beam."""
        step = BeamStep([], [], [], [])
        for beam in self.beams:
            if beam.copy_from is not None:
                target = blocks.allocate(1)[0]
                step.block_copies.append(BlockCopy(beam.copy_from, target))
                # The first child still references the source, which the copy reads before anyone writes it.
                blocks.free([beam.copy_from])
                beam.block_ids[-1] = target
                beam.copy_from = None
            held = list(beam.block_ids) if beam.new_row else []
            new_block_ids = blocks.allocate(-(-(beam.num_computed_tokens + 1) // block_size) - len(beam.block_ids))
            beam.block_ids.extend(new_block_ids)
            if beam.new_row:
                step.new_requests.append(NewRequest(request_id, beam.slot, [*prompt_token_ids, *beam.output_token_ids],
                                                    len(prompt_token_ids), self.worker_params))
            else:
                step.last_tokens.append(LastToken(beam.slot, beam.output_token_ids[-1]))
            # A copy-on-write target rides with the shared blocks: it must not be zeroed, the copy fills it.
            step.chunks.append(ScheduledChunk(beam.slot, beam.num_computed_tokens, 1, new_block_ids, held))
            beam.num_computed_tokens += 1
            beam.new_row = False
        self.in_flight = True
        return step

    def release(self, blocks: BlockManager) -> None:
        """Drop every block reference (last blocks first) and the slots (the caller has returned them)."""
        for beam in self.beams:
            blocks.free(reversed(beam.block_ids))
        self.beams = []
        self.slots = []
        self.in_flight = False

    def restart(self, slots: list[int]) -> None:
        """Start over in `slots` (at each admission, after a preemption too): a fresh search, no beams yet."""
        self.search = BeamSearch(self._params, self._max_new_tokens, self._eos_token_ids)
        self.slots = list(slots)
        self.beams = []
        self.in_flight = False
