"""Prompt pooling for embeddings: a pooling request's prompt reduced to one vector of final hidden states.

Key design choice: the vector comes out of the step whose chunk reaches the prompt's end, beside that step's
sampled token (the request asks for one token, so it ends there); "last" takes that chunk's last hidden state,
"mean" sums every chunk's states in float32 per slot, so chunked prefill pools the same vector as one chunk.
Mean pooling needs every prompt token computed: the scheduler's prefix cache skips such requests, and a resumed
request starts its sum again. Normalising is the frontend's choice (the API's `normalize`).

Usage: `pooling.start(slot, params)` with each (re)started request, `pooling.pool(...)` after each forward.
"""

from __future__ import annotations

import numpy as np
import torch

from rapid_llm.ipc.messages import PooledPrompt
from rapid_llm.sampling import SamplingParams


class PromptPooling:
    def __init__(self, max_num_seqs: int) -> None:
        self.kinds: list[str | None] = [None] * max_num_seqs
        self.active = np.zeros(max_num_seqs, dtype=bool)
        self._sums: dict[int, torch.Tensor] = {}  # slot -> float32 sum of its prompt's hidden states so far

    def start(self, slot: int, params: SamplingParams) -> None:
        self.kinds[slot] = params.pooling
        self.active[slot] = params.pooling is not None
        self._sums.pop(slot, None)

    def release(self, slots: list[int] | np.ndarray) -> None:
        for slot in slots:
            self.kinds[slot] = None
            self.active[slot] = False
            self._sums.pop(int(slot), None)

    def pool(self, request_ids: list[str | None], slots: np.ndarray, query_lens: np.ndarray, ends: np.ndarray,
             num_prompt_tokens: np.ndarray, hidden_states: torch.Tensor) -> list[PooledPrompt]:
        """The pooled prompts of the step's pooling rows whose chunk ends their prompt; `hidden_states` holds the
        step's new tokens, row after row."""
        pooled: list[PooledPrompt] = []
        if not self.active[slots].any():
            return pooled
        starts = np.cumsum(query_lens) - query_lens
        for row in np.flatnonzero(self.active[slots]).tolist():
            slot = int(slots[row])
            states = hidden_states[starts[row] : starts[row] + query_lens[row]]
            prompt_end = int(num_prompt_tokens[slot])
            # Rows past the prompt (the sampled token's own decode, never reached for a one-token request) add nothing.
            states = states[: max(0, prompt_end - (int(ends[row]) - int(query_lens[row])))]
            if self.kinds[slot] == "mean" and states.shape[0]:
                partial = states.float().sum(dim=0)
                self._sums[slot] = partial if slot not in self._sums else self._sums[slot] + partial
            if int(ends[row]) != prompt_end:
                continue
            if self.kinds[slot] == "mean":
                vector = self._sums.pop(slot) / prompt_end
            else:
                vector = states[-1].float()
            pooled.append(PooledPrompt(request_ids[slot] or "", vector.tolist()))
        return pooled
