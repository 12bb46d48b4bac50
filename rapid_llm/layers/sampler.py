"""Turns a batch of logits into next tokens (and optional logprobs) entirely on the device.

Pipeline: grammar bitmask (structured output, the `apply_token_bitmask` op) -> logit_bias -> penalties
-> min_tokens mask -> temperature -> top-k/top-p (the `top_k_top_p_filter` op)
-> min-p -> sample, with greedy rows taking the argmax of the penalised logits. Sampling is an
exponential race, argmax(logit - log E) with E ~ Exp(1), which needs no softmax, cumsum or
multinomial. The bitmask and logit_bias act on a float32 copy, as inputs of every later stage. For
rows with a seed, E comes from a counter-based hash of (seed, step, token id) in
int64 torch ops rather than from an RNG stream, so a seeded request draws the same tokens whatever
shares its batch and on CPU and CUDA alike. Logprobs are the raw model distribution (before
the bitmask, bias, penalties and temperature).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rapid_llm import ops
from rapid_llm.layers.logit_bias import LogitBias
from rapid_llm.layers.penalties import apply_penalties
from rapid_llm.layers.sampling_batch import SamplingBatch, to_int64

_GOLDEN = to_int64(0x9E3779B97F4A7C15)
_MIX1 = to_int64(0xBF58476D1CE4E5B9)
_MIX2 = to_int64(0x94D049BB133111EB)


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] float32 logprob of the sampled token; None if nobody asked
    top_token_ids: torch.Tensor | None  # [B, max_n] int64
    top_logprobs: torch.Tensor | None  # [B, max_n] float32


class Sampler:
    """Stateless: everything per-step lives in the `SamplingBatch`."""

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch, token_bitmask: torch.Tensor | None = None,
                 logit_bias: LogitBias | None = None) -> SamplerOutput:
        """`token_bitmask`: int32 [B, ceil(V / 32)] allowed tokens per row (xgrammar's layout; all ones for
        unconstrained rows), on the logits' device."""
        processed = logits
        if token_bitmask is not None or logit_bias is not None:
            processed = logits.float().clone()
            if token_bitmask is not None:
                processed = ops.apply_token_bitmask(processed, token_bitmask)
            if logit_bias is not None:
                processed = logit_bias.apply(processed)
        processed = apply_penalties(processed, batch)
        if batch.banned_mask is not None:
            processed = processed.masked_fill(batch.banned_mask, float("-inf"))
        token_ids = _sample(processed, batch)
        max_n = batch.max_num_logprobs
        if max_n is None:
            return SamplerOutput(token_ids, None, None, None)
        raw_logprobs = logits.float().log_softmax(dim=-1)
        sampled = raw_logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)
        top_logprobs, top_token_ids = raw_logprobs.topk(max_n, dim=-1)
        return SamplerOutput(token_ids, sampled, top_token_ids, top_logprobs)


def _sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """[B] int64 tokens from penalised float32 `logits` [B, V]."""
    if batch.all_greedy:
        return logits.argmax(dim=-1)
    greedy = logits.argmax(dim=-1) if batch.any_greedy else None
    logits = warp_logits(logits, batch)
    noise = log_exponential_noise(logits.shape, batch.seeded_rows, batch.seeds, batch.seed_steps, logits.device)
    sampled = (logits - noise).argmax(dim=-1)
    return sampled if greedy is None else torch.where(batch.is_greedy, greedy, sampled)


def warp_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Temperature, then top-k/top-p, then min-p: the logits whose softmax a sampled row draws from."""
    logits = logits / batch.temperature.unsqueeze(1)
    if batch.do_top_k or batch.do_top_p:
        logits = ops.top_k_top_p_filter(logits, batch.top_k, batch.top_p if batch.do_top_p else None,
                                        batch.max_top_k)
    if batch.do_min_p:
        # Renormalising after top-k/top-p scales every kept prob alike, so the min-p test
        # prob < min_p * max_prob is the same as logit < max_logit + log(min_p).
        floor = logits.amax(dim=-1, keepdim=True) + batch.min_p.log().unsqueeze(1)
        logits = logits.masked_fill(logits < floor, float("-inf"))
    return logits


def log_exponential_noise(shape: torch.Size, seeded_rows: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
                          device: torch.device) -> torch.Tensor:
    """log E, E ~ Exp(1) per (row, column): hashed from (seed, step, column) for `seeded_rows`, the default
    generator for the rest."""
    num_seeded = seeded_rows.numel()
    if num_seeded == shape[0]:
        return _hashed_log_exponential(seeds, steps, shape[1], device)
    # u == 0 gives log E = inf, i.e. that token loses the race, which is harmless.
    noise = torch.rand(shape, device=device).log_().neg_().log_()
    if num_seeded:
        seeded = _hashed_log_exponential(seeds, steps, shape[1], device)
        noise.index_copy_(0, seeded_rows, seeded)
    return noise


def _hashed_log_exponential(
    seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[S, V] float32 log E from splitmix64 hashes of (seed, step, token id): device-independent."""
    row_keys = _splitmix64(_splitmix64(seeds) + steps * _GOLDEN)
    token_ids = torch.arange(vocab_size, dtype=torch.int64, device=device)
    bits = _splitmix64(row_keys.unsqueeze(1) + token_ids * _GOLDEN)
    # The top 52 bits, centred in their bin: (2k + 1) / 2**53 is exact in float64 and lies
    # strictly inside (0, 1), so E = -log(u) is finite and positive.
    uniform = (_shift_right(bits, 12).double() + 0.5) * (2.0**-52)
    return uniform.log().neg().log().float()


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    """One splitmix64 output per int64 state (the state increment plus its finaliser; arithmetic wraps)."""
    z = z + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift: torch's >> on int64 is arithmetic, so clear the sign-extended bits."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)
