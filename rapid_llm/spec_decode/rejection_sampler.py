"""Lossless verification of drafted tokens against the target model's distributions, on the device.

Draft-free rule (n-gram, whose draft distribution q is one-hot on each draft d_i): sample the target's own
token s_i at every verified position i (the `Sampler`, greedy or not, with a seeded row's noise keyed by
the token's output index), accept drafts while d_i == s_i, and emit s_a at the first mismatch a (or the
bonus s_k when all k are accepted). That is exact rejection sampling: P(accept d_i) = P(s_i = d_i) =
p_i(d_i) = min(1, p_i(d_i) / q_i(d_i)), and given a rejection s_i is distributed as p_i without d_i,
renormalised, which is the residual max(0, p_i - q_i) normalised. Greedy is the special case s_i =
argmax p_i. Because s_i uses the noise a plain decode step would use for that output index, a seeded
request draws the same tokens with speculation on and off.

With draft probabilities (`rejection_sample`, for model-based proposers): accept d_i when u_i * q_i(d_i) <=
p_i(d_i), resample the first rejected position from normalise(max(0, p - q)), and the bonus from p_k.
Ragged drafts are padded to the batch's longest (pad = -1, never accepted).
"""

from __future__ import annotations

import torch


def accept_one_hot(target_tokens: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted [R], token [R]) from the target's samples [R, K + 1] and the drafts [R, K] (-1 = padding):
    the token is the target's sample at the first mismatch, or its bonus sample after K accepted."""
    matches = target_tokens[:, :-1] == draft_tokens
    num_accepted = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return num_accepted, target_tokens.gather(1, num_accepted.unsqueeze(1)).squeeze(1)


def rejection_sample(target_probs: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
                     uniform: torch.Tensor, log_exponential: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_accepted [R], token [R]) for drafts with their proposer's distributions.

    target_probs [R, K + 1, V] and draft_probs [R, K, V] (rows of padded positions are ignored), draft_tokens
    [R, K] (-1 = padding), uniform [R, K] in [0, 1), log_exponential [R, V]: log E, E ~ Exp(1), the noise of
    the one token drawn per row (residual or bonus) by the exponential race argmax(log p - log E).
    """
    num_rows, num_drafts = draft_tokens.shape
    padded = draft_tokens < 0
    safe = draft_tokens.clamp(min=0).unsqueeze(2)
    p_draft = target_probs[:, :num_drafts].gather(2, safe).squeeze(2)
    q_draft = draft_probs.gather(2, safe).squeeze(2)
    accepted = (uniform * q_draft <= p_draft) & ~padded
    num_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    rows = torch.arange(num_rows, device=draft_tokens.device)
    target = target_probs[rows, num_accepted]
    if num_drafts:
        # The bonus position (all accepted, or a row's padding reached) draws from p itself.
        position = num_accepted.clamp(max=num_drafts - 1)
        rejected = (num_accepted < num_drafts) & ~padded.gather(1, position.unsqueeze(1)).squeeze(1)
        draft = draft_probs[rows, position]
        residual = (target - draft).clamp(min=0)
        # A zero residual (p == q) cannot be rejected from; p keeps the draw well defined regardless.
        usable = rejected & (residual.sum(dim=1) > 0)
        target = torch.where(usable.unsqueeze(1), residual, target)
    token = (target.log() - log_exponential).argmax(dim=1)
    return num_accepted, token
