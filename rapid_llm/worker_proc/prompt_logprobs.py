"""Prompt logprobs: each prompt token's logprob (and rank, and the top-n) under the prefill's own logits.

The hidden state at position j predicts token j + 1, so a chunk computing prompt positions [c, e)
scores prompt tokens c + 1 .. min(e, P - 1) -- chunked prefill needs nothing extra, every chunk
scores its own span. Logits are computed `ROWS_PER_PIECE` rows at a time, so a long prompt over a
large vocabulary never materialises a [prompt, vocab] float32 tensor at once.

Usage:
    chunks = score_prompts(logits_of, requests)  # list[PromptLogprobs], one per chunk that scores
where `logits_of(rows)` computes the logits of a slice of the step's tokens (the model runner's `_logits`).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch

from rapid_llm.ipc.messages import PromptLogprobs, TokenLogprobs
from rapid_llm.sampling import SamplingParams

ROWS_PER_PIECE = 1024


class ScoredChunk(Protocol):
    request_id: str
    prompt_token_ids: Sequence[int]
    num_computed_tokens: int
    num_new_tokens: int
    sampling_params: SamplingParams


LogitsOf = Callable[[slice], torch.Tensor]  # logits [rows, vocab] of a slice of the step's tokens


def score_prompts(logits_of: LogitsOf, requests: Sequence[ScoredChunk]) -> list[PromptLogprobs]:
    """Prompt logprobs of every request in the step that asked and whose chunk covers prompt tokens."""
    results = []
    row = 0
    for request in requests:
        params = request.sampling_params
        first, end = request.num_computed_tokens, request.num_computed_tokens + request.num_new_tokens
        last = min(end, len(request.prompt_token_ids) - 1)  # the last prompt token predicts an output
        if params.prompt_logprobs is not None and last > first:
            targets = torch.tensor(request.prompt_token_ids[first + 1 : last + 1])
            entries = _score(logits_of, row, targets, params.prompt_logprobs)
            results.append(PromptLogprobs(request.request_id, first + 1, entries))
        row += request.num_new_tokens
    return results


def _score(logits_of: LogitsOf, first_row: int, targets: torch.Tensor, top_n: int) -> list[TokenLogprobs]:
    """Entries for the step's tokens first_row, first_row + 1, ... scored against `targets`."""
    entries: list[TokenLogprobs] = []
    for start in range(0, targets.shape[0], ROWS_PER_PIECE):
        end = min(start + ROWS_PER_PIECE, targets.shape[0])
        logprobs = logits_of(slice(first_row + start, first_row + end)).float().log_softmax(dim=-1)
        piece_targets = targets[start:end].to(logprobs.device)
        chosen = logprobs.gather(1, piece_targets.unsqueeze(1))
        # Ties rank the token first among equals, as vLLM counts only strictly larger logprobs.
        ranks = (logprobs > chosen).sum(dim=-1) + 1
        top_values, top_ids = logprobs.topk(top_n, dim=-1) if top_n else (None, None)
        chosen_list, rank_list = chosen.squeeze(1).tolist(), ranks.tolist()
        top_id_list = top_ids.tolist() if top_ids is not None else [[]] * len(chosen_list)
        top_value_list = top_values.tolist() if top_values is not None else [[]] * len(chosen_list)
        entries.extend(TokenLogprobs(logprob, ids, values, rank)
                       for logprob, ids, values, rank in zip(chosen_list, top_id_list, top_value_list, rank_list))
    return entries
