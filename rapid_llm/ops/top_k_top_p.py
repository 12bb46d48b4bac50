"""The `top_k_top_p_filter` op: mask every logit outside each row's top-k / top-p (nucleus) set with -inf.

Kept set of a row: sort its logits descending; keep = min(top_k, n) where n is the number of leading
tokens whose cumulative probability (over the top-k survivors) stays below top_p, plus the one that
reaches it; every token whose logit is >= the keep-th largest logit survives, so tokens tied with the
cutoff are all kept. `torch_ref` finds it with a full-vocabulary sort (the oracle). `torch_topk` sorts
only a candidate set with `torch.topk`: the max_top_k largest logits, or for top-p at least
TOP_P_CANDIDATES of them; a row whose nucleus does not end inside its candidates is handed to the
reference, so both give the same set (on CUDA that check is one host sync, taken only with top-p).
Usage: `ops.top_k_top_p_filter(logits [B, V], top_k [B] (V = off), top_p [B] (inf = off) | None, max_top_k)`,
max_top_k = the largest top_k below V in the batch (0 if none).
"""

from __future__ import annotations

import torch

# Float32 softmax+cumsum lands a few ulps off the exact sums; without slack, probabilities
# 0.6 + 0.27 with top_p=0.87 would sum to just below 0.87 and pull in a third token.
TOP_P_SLACK = 1e-6
# Candidates torch_topk sorts for a top-p row: a nucleus of at most this many tokens (sharp
# distributions, the common case) costs a topk of 256; wider ones pay the reference's sort on top.
TOP_P_CANDIDATES = 256


def top_k_top_p_filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor | None,
                       max_top_k: int) -> torch.Tensor:
    """The reference: one descending sort of the whole vocabulary per row."""
    sorted_logits = logits.sort(dim=-1, descending=True).values
    keep = top_k
    if top_p is not None:
        keep = torch.minimum(keep, _nucleus_sizes(_top_k_probs(sorted_logits, top_k), top_p))
    return _mask_below_cutoff(logits, sorted_logits, keep)


def top_k_top_p_filter_topk(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor | None,
                            max_top_k: int) -> torch.Tensor:
    """The same set from the `width` largest logits of each row, found by torch.topk."""
    vocab_size = logits.shape[-1]
    width = max(max_top_k, TOP_P_CANDIDATES) if top_p is not None else max_top_k
    if width == 0:
        return logits
    if width >= vocab_size:
        return top_k_top_p_filter(logits, top_k, top_p, max_top_k)
    candidates = logits.topk(width, dim=-1).values  # sorted descending, ties included
    if top_p is None:
        return _mask_below_cutoff(logits, candidates, top_k)
    # A row whose top-k set lies inside the candidates renormalises over them exactly as the reference
    # does; a row without top-k (k = V) needs the whole row's normaliser.
    inside = top_k <= width
    whole_row = (candidates - logits.logsumexp(dim=-1, keepdim=True)).exp()
    probs = torch.where(inside.unsqueeze(1), _top_k_probs(candidates, top_k), whole_row)
    nucleus = _nucleus_sizes(probs, top_p)
    filtered = _mask_below_cutoff(logits, candidates, torch.minimum(top_k, nucleus))
    # All candidates below top_p: the nucleus goes on past them (top_p = inf, i.e. off, never counts).
    outside = ~inside & (nucleus > width) & torch.isfinite(top_p)
    if outside.any():
        rows = outside.nonzero().squeeze(1)
        filtered[rows] = top_k_top_p_filter(logits[rows], top_k[rows], top_p[rows], max_top_k)
    return filtered


def _top_k_probs(sorted_logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Probabilities of descending logits renormalised over each row's first top_k (top-p sees those)."""
    ranks = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)
    return sorted_logits.masked_fill(ranks >= top_k.unsqueeze(1), float("-inf")).softmax(dim=-1)


def _nucleus_sizes(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Tokens before the cumulative sum reaches top_p, plus the one that reaches it."""
    below = sorted_probs.cumsum(dim=-1) < (top_p - TOP_P_SLACK).unsqueeze(1)
    return below.sum(dim=-1) + 1


def _mask_below_cutoff(logits: torch.Tensor, sorted_logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """-inf below each row's keep-th largest logit; a row keeping more than `sorted_logits` holds keeps all."""
    width = sorted_logits.shape[-1]
    cutoff = sorted_logits.gather(1, (keep.clamp(max=width) - 1).unsqueeze(1))
    cutoff = cutoff.masked_fill((keep > width).unsqueeze(1), float("-inf"))
    return logits.masked_fill(logits < cutoff, float("-inf"))
