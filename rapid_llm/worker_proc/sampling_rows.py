"""Per-slot sampling state kept across steps; a step's `SamplingBatch` is gathered from it by slot index.

A request's row is written once, when it enters its slot: `SamplingBatch.build` of that one request (on
the CPU, which also validates it) gives the normalised values (neutral where a feature is off), which go
into host arrays (for the batch's Python flags) and device rows (for the sampler's tensors). Output-token
counts for the penalties live in one [slots, V] int32 device tensor, allocated when the first request with
a penalty arrives: a request's row is loaded from its known outputs when it enters and then grows by one
scatter-add per step over every sampled row, so nothing is recounted from token lists. The prompt mask
(repetition penalty) is likewise a [slots, V] bool tensor written once per request. Rows of requests
without penalties hold counts the sampler multiplies by neutral parameters, so they need not be exact.

Usage:
    rows.add(slot, one_row_batch, banned_ids, params)       # when a request (re)enters a slot
    batch = rows.batch(slots, slots_on_device, num_outputs)   # each step, for the rows that sample
    rows.count(slots_on_device, token_ids)                  # after sampling
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from rapid_llm.layers.sampling_batch import SamplingBatch, count_tokens
from rapid_llm.sampling import SamplingParams
from rapid_llm.utils.host_staging import to_device

# Columns of the float rows, gathered with one index op per step.
_TEMPERATURE, _TOP_P, _MIN_P, _REPETITION, _FREQUENCY, _PRESENCE = range(6)


class SamplingRows:
    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self.floats = torch.zeros(num_rows, 6, dtype=torch.float32, device=device)
        self.top_k = torch.full((num_rows,), vocab_size, dtype=torch.int64, device=device)
        self.greedy = torch.ones(num_rows, dtype=torch.bool, device=device)
        # Host copies of what decides the batch's flags: reading them never touches the device.
        self.host_greedy = np.ones(num_rows, dtype=bool)
        self.host_top_k = np.full(num_rows, vocab_size, dtype=np.int64)
        self.host_top_p = np.full(num_rows, np.inf, dtype=np.float32)
        self.host_min_p = np.zeros(num_rows, dtype=np.float32)
        self.host_seeded = np.zeros(num_rows, dtype=bool)
        self.host_seed = np.zeros(num_rows, dtype=np.int64)
        self.host_penalty = np.zeros(num_rows, dtype=bool)
        self.host_repetition = np.zeros(num_rows, dtype=bool)
        self.host_logprobs = np.full(num_rows, -1, dtype=np.int64)
        self.host_min_tokens = np.zeros(num_rows, dtype=np.int64)
        # Greedy without penalties, logprobs or min_tokens: a step of only such rows needs no gather at all.
        self.host_plain = np.ones(num_rows, dtype=bool)
        self._neutral = _NeutralRows(num_rows, vocab_size, device)
        self.banned_ids: list[list[int]] = [[] for _ in range(num_rows)]
        self.output_counts: torch.Tensor | None = None
        self.prompt_mask: torch.Tensor | None = None

    def add(self, slot: int, row: SamplingBatch, banned_ids: list[int], params: SamplingParams) -> None:
        """Store one request's normalised row (`row`, a one-request batch built with its token history)."""
        # Staged copies and scalar fills: a plain copy from pageable memory would make the host wait for the device.
        values = torch.stack([row.temperature[0], row.top_p[0], row.min_p[0], row.repetition_penalty[0],
                              row.frequency_penalty[0], row.presence_penalty[0]])
        self.floats[slot] = to_device([values], self.device)[0]
        self.top_k[slot] = int(row.top_k[0])
        self.greedy[slot] = bool(row.is_greedy[0])
        self.host_greedy[slot] = bool(row.is_greedy[0])
        self.host_top_k[slot] = int(row.top_k[0])
        self.host_top_p[slot] = float(row.top_p[0])
        self.host_min_p[slot] = float(row.min_p[0])
        self.host_seeded[slot] = row.seeds.numel() > 0
        self.host_seed[slot] = int(row.seeds[0]) if row.seeds.numel() else 0
        self.host_penalty[slot] = row.output_counts is not None
        self.host_repetition[slot] = row.prompt_mask is not None
        self.host_logprobs[slot] = -1 if row.max_num_logprobs is None else row.max_num_logprobs
        self.host_min_tokens[slot] = params.min_tokens
        self.host_plain[slot] = (self.host_greedy[slot] and not self.host_penalty[slot]
                                 and self.host_logprobs[slot] < 0 and params.min_tokens == 0)
        self.banned_ids[slot] = banned_ids
        if row.output_counts is not None and self.output_counts is None:
            self.output_counts = self._zeros(torch.int32)
        if self.output_counts is not None:
            if row.output_counts is None:
                self.output_counts[slot] = 0
            else:
                self.output_counts[slot] = to_device([row.output_counts[0]], self.device)[0]
        if row.prompt_mask is not None and self.prompt_mask is None:
            self.prompt_mask = self._zeros(torch.bool)
        if self.prompt_mask is not None:
            if row.prompt_mask is None:
                self.prompt_mask[slot] = False
            else:
                self.prompt_mask[slot] = to_device([row.prompt_mask[0]], self.device)[0]

    def _zeros(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.floats.shape[0], self.vocab_size, dtype=dtype, device=self.device)

    def batch(self, slots: np.ndarray, slots_on_device: torch.Tensor, num_outputs: np.ndarray) -> SamplingBatch:
        """The SamplingBatch of rows `slots` (host int64 array, and the same on the device), whose requests have
        generated `num_outputs` tokens each before this step's sample."""
        if self.host_plain[slots].all():
            return self._neutral.batch(len(slots))
        greedy = self.host_greedy[slots]
        top_k, top_p, min_p = self.host_top_k[slots], self.host_top_p[slots], self.host_min_p[slots]
        seeded = np.flatnonzero(self.host_seeded[slots] & ~greedy)
        below = top_k[top_k < self.vocab_size]
        asked = self.host_logprobs[slots]
        uses_penalty, uses_repetition = self.host_penalty[slots].any(), self.host_repetition[slots].any()
        seeded_rows, seeds, seed_steps = to_device([torch.from_numpy(seeded), torch.from_numpy(self.host_seed[slots[seeded]]),
                                                    torch.from_numpy(num_outputs[seeded])], self.device)
        floats = self.floats[slots_on_device]
        return SamplingBatch(
            is_greedy=self.greedy[slots_on_device],
            temperature=floats[:, _TEMPERATURE],
            top_k=self.top_k[slots_on_device],
            max_top_k=int(below.max()) if below.size else 0,
            top_p=floats[:, _TOP_P],
            min_p=floats[:, _MIN_P],
            seeded_rows=seeded_rows,
            seeds=seeds,
            seed_steps=seed_steps,
            repetition_penalty=floats[:, _REPETITION],
            frequency_penalty=floats[:, _FREQUENCY],
            presence_penalty=floats[:, _PRESENCE],
            output_counts=self.output_counts[slots_on_device] if uses_penalty else None,
            prompt_mask=self.prompt_mask[slots_on_device] if uses_repetition else None,
            banned_mask=self._banned_mask(slots, num_outputs),
            max_num_logprobs=int(asked.max()) if asked.max() >= 0 else None,
            all_greedy=bool(greedy.all()),
            any_greedy=bool(greedy.any()),
            do_top_k=below.size > 0,
            do_top_p=bool((top_p < 1.0).any()),
            do_min_p=bool((min_p > 0.0).any()),
        )

    def _banned_mask(self, slots: np.ndarray, num_outputs: np.ndarray) -> torch.Tensor | None:
        """[B, V] bool of the ids rows still below min_tokens may not sample; None when no row is."""
        below = self.host_min_tokens[slots] > num_outputs
        if not below.any():
            return None
        rows: Sequence[list[int]] = [self.banned_ids[slot] if low else [] for slot, low in zip(slots.tolist(), below)]
        return count_tokens(rows, self.vocab_size, self.device) > 0 if any(rows) else None

    def count(self, slots_on_device: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Add each sampled token to its row's output counts (when any request has asked for penalties)."""
        if self.output_counts is not None:
            self.output_counts.index_put_((slots_on_device, token_ids),
                                          torch.ones_like(token_ids, dtype=torch.int32), accumulate=True)


class _NeutralRows:
    """Every field's neutral value, preallocated: a step of plain greedy rows slices these (the values a gather
    would give those rows) instead of gathering. The slices are shared, so the sampler must not write them
    (it does not: every stage returns new tensors)."""

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.ones = torch.ones(num_rows, dtype=torch.float32, device=device)
        self.zeros = torch.zeros(num_rows, dtype=torch.float32, device=device)
        self.inf = torch.full((num_rows,), float("inf"), dtype=torch.float32, device=device)
        self.vocab = torch.full((num_rows,), vocab_size, dtype=torch.int64, device=device)
        self.greedy = torch.ones(num_rows, dtype=torch.bool, device=device)
        self.empty = torch.empty(0, dtype=torch.int64, device=device)

    def batch(self, size: int) -> SamplingBatch:
        ones, zeros = self.ones[:size], self.zeros[:size]
        return SamplingBatch(
            is_greedy=self.greedy[:size], temperature=ones, top_k=self.vocab[:size], max_top_k=0,
            top_p=self.inf[:size], min_p=zeros, seeded_rows=self.empty, seeds=self.empty, seed_steps=self.empty,
            repetition_penalty=ones, frequency_penalty=zeros, presence_penalty=zeros, output_counts=None,
            prompt_mask=None, banned_mask=None, max_num_logprobs=None, all_greedy=True, any_greedy=True,
            do_top_k=False, do_top_p=False, do_min_p=False,
        )
