"""Per-step sampling tensors built from the per-request parameters of one batch.

`SamplingBatch.build` is the only place that touches Python lists: it turns each request's
`SamplingParams` and token history into [B] parameter tensors and dense [B, V] count / mask
tensors on the target device, plus Python-bool stage flags. The sampler then runs pure tensor ops
and can skip whole stages (penalties, top-k/top-p, min-p, seeded noise) without a device sync.
Rows that do not use a feature hold its neutral value, so one code path serves every row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rapid_llm.sampling.params import SamplingParams

_UINT64_MASK = (1 << 64) - 1


@dataclass
class SamplingRequest:
    """What the runner knows of one request at this step."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]  # generated so far, before this step's sample
    eos_token_ids: Sequence[int]  # masked while below min_tokens unless ignore_eos


@dataclass
class SamplingBatch:
    """Batched sampling state for B rows over a vocabulary of V logits, all on one device."""

    is_greedy: torch.Tensor  # [B] bool: temperature 0 or top_k 1
    temperature: torch.Tensor  # [B] float32; 1.0 on greedy rows so dividing is always safe
    top_k: torch.Tensor  # [B] int64 in [1, V]; V where off
    max_top_k: int  # largest top_k below V (what a topk-based filter must find); 0 if none
    top_p: torch.Tensor  # [B] float32; inf where off, so the nucleus never cuts
    min_p: torch.Tensor  # [B] float32; 0 where off
    seeded_rows: torch.Tensor  # [S] int64 row indices of sampled rows that carry a seed
    seeds: torch.Tensor  # [S] int64, the seed reduced to 64 bits
    seed_steps: torch.Tensor  # [S] int64, tokens generated so far (the counter of the noise hash)
    repetition_penalty: torch.Tensor  # [B] float32; 1.0 where off
    frequency_penalty: torch.Tensor  # [B] float32; 0 where off
    presence_penalty: torch.Tensor  # [B] float32; 0 where off
    output_counts: torch.Tensor | None  # [B, V] int32 occurrences in the output; None if no penalties
    prompt_mask: torch.Tensor | None  # [B, V] bool token is in the prompt; None if no repetition penalty
    banned_mask: torch.Tensor | None  # [B, V] bool tokens forbidden by min_tokens; None if none
    max_num_logprobs: int | None  # largest `logprobs` asked in the batch; None if nobody asked
    all_greedy: bool
    any_greedy: bool
    do_top_k: bool
    do_top_p: bool
    do_min_p: bool

    @classmethod
    def build(cls, requests: Sequence[SamplingRequest], vocab_size: int, device: torch.device) -> SamplingBatch:
        """Batch `requests` (row i is request i) for logits of width `vocab_size` on `device`."""
        if not requests:
            raise ValueError("cannot build a SamplingBatch from zero requests")
        params = [r.params for r in requests]
        greedy = [p.is_greedy for p in params]
        # Greedy rows never reach the filters, so they get neutral values and leave the flags off.
        top_k = [vocab_size if g or p.top_k <= 0 else min(p.top_k, vocab_size) for p, g in zip(params, greedy)]
        top_p = [float("inf") if g or p.top_p >= 1.0 else p.top_p for p, g in zip(params, greedy)]
        min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
        seeded = [i for i, p in enumerate(params) if p.seed is not None and not greedy[i]]

        uses_repetition = [p.repetition_penalty != 1.0 for p in params]
        uses_penalty = [
            rep or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
            for p, rep in zip(params, uses_repetition)
        ]
        banned = [_banned_ids(r) for r in requests]

        def tensor(values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        output_counts = prompt_mask = banned_mask = None
        if any(uses_penalty):
            outputs = [r.output_token_ids if use else () for r, use in zip(requests, uses_penalty)]
            output_counts = count_tokens(outputs, vocab_size, device)
        if any(uses_repetition):
            prompts = [r.prompt_token_ids if use else () for r, use in zip(requests, uses_repetition)]
            prompt_mask = count_tokens(prompts, vocab_size, device) > 0
        if any(banned):
            banned_mask = count_tokens(banned, vocab_size, device) > 0

        asked = [p.logprobs for p in params if p.logprobs is not None]
        return cls(
            is_greedy=tensor(greedy, torch.bool),
            temperature=tensor([1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32),
            top_k=tensor(top_k, torch.int64),
            max_top_k=max((k for k in top_k if k < vocab_size), default=0),
            top_p=tensor(top_p, torch.float32),
            min_p=tensor(min_p, torch.float32),
            seeded_rows=tensor(seeded, torch.int64),
            seeds=tensor([to_int64(params[i].seed) for i in seeded], torch.int64),
            seed_steps=tensor([len(requests[i].output_token_ids) for i in seeded], torch.int64),
            repetition_penalty=tensor([p.repetition_penalty for p in params], torch.float32),
            frequency_penalty=tensor([p.frequency_penalty for p in params], torch.float32),
            presence_penalty=tensor([p.presence_penalty for p in params], torch.float32),
            output_counts=output_counts,
            prompt_mask=prompt_mask,
            banned_mask=banned_mask,
            max_num_logprobs=max(asked) if asked else None,
            all_greedy=all(greedy),
            any_greedy=any(greedy),
            do_top_k=any(k < vocab_size for k in top_k),
            do_top_p=any(p < 1.0 for p in top_p),
            do_min_p=any(p > 0.0 for p in min_p),
        )


def _banned_ids(request: SamplingRequest) -> list[int]:
    """Ids that may not be sampled yet because the request is still below `min_tokens`."""
    if len(request.output_token_ids) >= request.params.min_tokens:
        return []
    return min_tokens_banned_ids(request.params, request.eos_token_ids)


def min_tokens_banned_ids(params: SamplingParams, eos_token_ids: Sequence[int]) -> list[int]:
    """The ids `min_tokens` holds back while a request is below it: EOS (unless ignore_eos) and stop ids."""
    eos = [] if params.ignore_eos else list(eos_token_ids)
    return eos + list(params.stop_token_ids)


def to_int64(seed: int) -> int:
    """Any Python int as the signed int64 with the same low 64 bits, so big or negative seeds work."""
    seed &= _UINT64_MASK
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def count_tokens(rows: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, V] int32 count of each token id per row, via one scatter_add over the flattened ids."""
    lengths = torch.tensor([len(ids) for ids in rows], dtype=torch.int64)
    ids = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.int64)
    row_index = torch.repeat_interleave(torch.arange(len(rows)), lengths)
    # Ids past the logits (e.g. a stop id beyond the model's vocabulary) can never be sampled,
    # so there is nothing to penalise or mask for them.
    in_range = (ids >= 0) & (ids < vocab_size)
    flat = (row_index[in_range] * vocab_size + ids[in_range]).to(device)
    counts = torch.zeros(len(rows) * vocab_size, dtype=torch.int32, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    return counts.view(len(rows), vocab_size)
