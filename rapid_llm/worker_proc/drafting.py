"""The runner's side of a worker-side proposer (`spec_decode/model_proposer.py`): who drafts, and verifying with q.

After every target step `propose` hands the proposer the step (it catches up on the step's tokens even when
nobody samples) and the sampling rows that draft: their request may speculate (`speculation_blocker`), the plan
did not pause it (`ScheduledChunk.draft_after`: adaptive off), and it has room for a draft under max_tokens and
max_model_len. The drafts go back in the step's result; the draft
distributions q of sampled rows stay here, per slot, keyed by the position of the first draft. When the next
step verifies that slot's drafts at that position, `verify` replaces the one-hot decision with the exact rule
(`rejection_sample`: accept with min(1, p/q), resample the residual, bonus from p) for those rows. Its uniforms
and its one draw per row are hashed from a seeded row's seed (two salts, independent of the target's own
noise and of the draft's), so seeded output stays reproducible. Greedy rows keep argmax matching. A proposer
whose catch-up reads token ids only (`catch_up_from_tokens`: the draft model) is not called in a step where no
row drafts (adaptive off paused them all) and no chunk computes prompt positions (those blocks may reach
another request through the prefix cache); per slot, the position up to which its KV is valid is kept, and its
next catch-up starts there, so the skipped positions are computed then.
"""

from __future__ import annotations

import numpy as np
import torch

from rapid_llm.config.speculative_config import SpeculativeConfig
from rapid_llm.distributed import tp_broadcast
from rapid_llm.layers.sampler import log_exponential_noise, warp_logits
from rapid_llm.layers.sampling_batch import SamplingBatch, to_int64
from rapid_llm.sampling import SamplingParams
from rapid_llm.spec_decode.eligibility import speculation_blocker
from rapid_llm.spec_decode.model_proposer import HiddenStateTap, ModelProposer, ProposerStep
from rapid_llm.spec_decode.rejection_sampler import rejection_sample
from rapid_llm.utils.host_staging import to_device
from rapid_llm.worker_proc.input_batch import InputBatch

_UNIFORM_SALT = to_int64(0x2545F4914F6CDD1D)
_RESIDUAL_SALT = to_int64(0x7F4A7C159E3779B9)


class Drafting:
    def __init__(self, proposer: ModelProposer, config: SpeculativeConfig, batch: InputBatch,
                 tap: HiddenStateTap) -> None:
        self.proposer, self.config, self.batch, self.tap = proposer, config, batch, tap
        rows = batch.max_num_seqs
        self.eligible = np.zeros(rows, dtype=bool)
        self.wanted = np.ones(rows, dtype=bool)  # per step from the plan (`ScheduledChunk.draft_after`)
        self.max_tokens = np.zeros(rows, dtype=np.int64)
        # Per slot, for a proposer that catches up from tokens: its KV is valid before this position (-1: not known
        # until the slot's first step).
        self.kv_valid = np.full(rows, -1, dtype=np.int64)
        self.draft_probs: dict[int, tuple[int, torch.Tensor]] = {}  # slot -> (first draft position, q [n, V])

    def add(self, slot: int, params: SamplingParams) -> None:
        self.eligible[slot] = speculation_blocker(params) is None
        self.wanted[slot] = True
        self.max_tokens[slot] = self.batch.max_model_len if params.max_tokens is None else params.max_tokens
        self.kv_valid[slot] = -1
        self.draft_probs.pop(slot, None)

    def release(self, slots) -> None:
        for slot in slots:
            self.eligible[slot] = False
            self.draft_probs.pop(slot, None)

    def propose(self, slots: np.ndarray, starts: np.ndarray, query_lens: np.ndarray, hidden_states: torch.Tensor,
                samples: np.ndarray, new_lengths: np.ndarray) -> torch.Tensor | None:
        """Drafts [len(samples), k] (-1: none) after this step; `new_lengths`: each sampling row's known tokens."""
        batch = self.batch
        sample_slots = slots[samples]
        outputs = new_lengths - batch.num_prompt_tokens[sample_slots]
        max_drafts = np.minimum(self.config.num_speculative_tokens,
                                np.minimum(batch.max_model_len - new_lengths, self.max_tokens[sample_slots] - outputs) - 1)
        drafting = np.flatnonzero(self.eligible[sample_slots] & self.wanted[sample_slots] & (max_drafts > 0))
        states = self.tap.take(hidden_states)
        if self.proposer.catch_up_from_tokens:
            unknown = self.kv_valid[slots] < 0
            self.kv_valid[slots[unknown]] = starts[unknown]
            # Prompt positions are always computed: the prefix cache may hand their blocks to a later request.
            if not drafting.size and not (starts < batch.num_prompt_tokens[slots]).any():
                return None
            ends = starts + query_lens
            starts = np.minimum(starts, self.kv_valid[slots])
            query_lens, states = ends - starts, {}
            self.kv_valid[slots] = ends
        step = ProposerStep(slots, starts, query_lens, [batch.host_block_tables[slot] for slot in slots.tolist()],
                            states, samples[drafting], new_lengths[drafting], outputs[drafting],
                            max_drafts[drafting], batch.token_pool, batch.sampling)
        drafts = self.proposer.propose(step)
        if not samples.size:
            return None
        for index in np.flatnonzero(drafts.sampled).tolist():
            slot, row = int(sample_slots[drafting[index]]), drafting[index]
            self.draft_probs[slot] = (int(new_lengths[row]), drafts.probs[index, : max_drafts[row]])
        out = torch.full((samples.size, self.config.num_speculative_tokens), -1, dtype=torch.int64,
                         device=batch.device)
        if drafting.size:
            index = to_device([torch.from_numpy(drafting)], batch.device)[0]
            out[index, : drafts.token_ids.shape[1]] = drafts.token_ids
        return out

    def verify(self, logits: torch.Tensor, sampling_batch: SamplingBatch, counts: np.ndarray, sample_slots: np.ndarray,
               first_positions: np.ndarray, num_outputs: np.ndarray, drafts: torch.Tensor, num_accepted: torch.Tensor,
               token_ids: torch.Tensor) -> None:
        """Redo the accept decision, in place, for the rows whose drafts come with q (see the module docstring).

        logits [E, V]: the expanded rows (counts[r] = 1 + drafts of sampling row r), with their SamplingBatch and
        output indices; drafts [R, K] (-1 padded); num_accepted and token_ids [R] from the one-hot decision."""
        rows, probs = [], []
        for row, slot in enumerate(sample_slots.tolist()):
            stored = self.draft_probs.pop(slot, None) if counts[row] > 1 else None
            if stored is not None and stored[0] == first_positions[row] and stored[1].shape[0] >= counts[row] - 1:
                rows.append(row)
                probs.append(stored[1][: counts[row] - 1])
        if not rows:
            return
        device = logits.device
        width = drafts.shape[1]
        starts = np.cumsum(counts) - counts
        picked = np.array(rows, dtype=np.int64)
        # Row r's positions 0..counts-1 sit at expanded rows starts[r] + j; padding repeats its last one.
        grid = starts[picked, None] + np.minimum(np.arange(width + 1), counts[picked, None] - 1)
        target = warp_logits(logits.float(), sampling_batch).softmax(dim=-1)
        grid_on_device, picked_on_device = to_device([torch.from_numpy(grid), torch.from_numpy(picked)], device)
        target_probs = target[grid_on_device]
        draft_probs = torch.zeros(len(rows), width, target.shape[1], dtype=torch.float32, device=device)
        for index, q in enumerate(probs):
            draft_probs[index, : q.shape[0]] = q
        uniform, log_exponential = self._noise(sample_slots[picked], num_outputs[starts[picked]], width,
                                               target.shape[1], device)
        accepted, tokens = rejection_sample(target_probs, drafts[picked_on_device], draft_probs, uniform,
                                            log_exponential)
        # Unseeded uniforms differ between tensor-parallel ranks: every rank takes rank 0's decision.
        num_accepted[picked_on_device] = tp_broadcast(accepted)
        token_ids[picked_on_device] = tp_broadcast(tokens)

    def _noise(self, slots: np.ndarray, first_outputs: np.ndarray, width: int, vocab_size: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """uniform [R, width] (one per draft, keyed by its output index) and log E [R, V] (the row's one draw)."""
        sampling = self.batch.sampling
        seeded = np.flatnonzero(sampling.host_seeded[slots])
        seeds = sampling.host_seed[slots[seeded]]
        positions = np.arange(width)
        expanded = (seeded[:, None] * width + positions).reshape(-1)
        steps = (first_outputs[seeded, None] + positions).reshape(-1)
        seed_rows, seed_values, seed_steps, cell_rows, cell_seeds, cell_steps = to_device(
            [torch.from_numpy(array) for array in (seeded, seeds, first_outputs[seeded], expanded,
                                                   np.repeat(seeds, width), steps)], device)
        log_e = log_exponential_noise(torch.Size((slots.size * width, 1)), cell_rows, cell_seeds ^ _UNIFORM_SALT,
                                      cell_steps, device)
        uniform = torch.exp(-log_e.exp()).view(slots.size, width)
        draw = log_exponential_noise(torch.Size((slots.size, vocab_size)), seed_rows, seed_values ^ _RESIDUAL_SALT,
                                     seed_steps, device)
        return uniform, draw
