"""Beam search's ranking rule, as transformers 5.x `generate(num_beams=W, do_sample=False)` applies it.

Pure arithmetic over (cumulative logprob, token) candidates: no blocks, slots or tensors (`beam_group.py`
maps it onto KV blocks). Scores are float32 sums, as HF keeps them, so near-ties break the same way. Each
step ranks the best `num_candidates` = max(2, 1 + #stop ids) * W continuations over all live beams; the
first W of them that end (a stop id, or max_tokens) become finished hypotheses scored by
cum_logprob / generated_len ** length_penalty (the top W hypotheses are kept); the best W that do not end
are the next beams. `early_stopping` is HF's: True stops once W hypotheses exist, False stops when the
best live beam at its current length cannot beat the worst hypothesis, "never" makes that bound use
max_tokens when length_penalty > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rapid_llm.sampling import SamplingParams

# HF's stand-in for "no score" (an empty hypothesis slot).
_NO_SCORE = np.float32(-1.0e9)


def stop_ids(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> set[int]:
    """The tokens that end a beam: stop_token_ids, and EOS unless ignore_eos."""
    return set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))


def num_candidates(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> int:
    """Continuations ranked per round, HF's max(2, 1 + #eos ids) x width: enough for W live beams even when
    each of W beams' best continuations ends."""
    return max(2, 1 + len(stop_ids(params, eos_token_ids))) * params.num_beams


@dataclass
class Hypothesis:
    token_ids: list[int]  # the output tokens, the stop token included
    cumulative_logprob: np.float32
    score: np.float32
    finish_reason: str  # "stop" | "length"
    stop_reason: int | None


@dataclass
class Continuation:
    parent: int  # index of the beam it extends
    token_id: int
    cumulative_logprob: np.float32


class BeamSearch:
    """One request's hypotheses and stopping state; `step` ranks one round of candidates."""

    def __init__(self, params: SamplingParams, max_new_tokens: int, eos_token_ids: tuple[int, ...]) -> None:
        self.width = params.num_beams
        self.num_return = params.n
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = set(params.stop_token_ids)
        self.eos_token_ids = stop_ids(params, eos_token_ids) - self.stop_token_ids
        self.num_candidates = num_candidates(params, eos_token_ids)
        self.hypotheses: list[Hypothesis] = []
        self.num_generated = 0
        self.improvement_possible = True
        self.done = False

    def step(self, outputs: list[list[int]], cumulative: list[np.float32],
             candidates: list[list[tuple[int, float]]]) -> list[Continuation]:
        """One round: beam i has output tokens outputs[i], score cumulative[i] and candidates[i] = its
        most likely (token, logprob) pairs (at least `num_candidates`). Returns the next beams, best first."""
        ranked = sorted(
            ((np.float32(cumulative[beam] + np.float32(logprob)), beam, rank, token)
             for beam, pairs in enumerate(candidates) for rank, (token, logprob) in enumerate(pairs)),
            key=lambda item: (-item[0], item[1], item[2]))[: self.num_candidates]
        ends_by_length = self.num_generated + 1 >= self.max_new_tokens
        ending = [ends_by_length or token in self.stop_token_ids or token in self.eos_token_ids
                  for _, _, _, token in ranked]
        self._add_hypotheses(outputs, ranked, ending)
        running = [Continuation(beam, token, score) for (score, beam, _, token), ends in zip(ranked, ending)
                   if not ends][: self.width]
        self.num_generated += 1
        if running:
            self._update_improvement(running[0].cumulative_logprob)
        full = len(self.hypotheses) == self.width
        self.done = (not running or not self.improvement_possible or (self.early_stopping is True and full))
        return running

    def best(self) -> list[Hypothesis]:
        """The n best hypotheses, best first."""
        return self.hypotheses[: self.num_return]

    def _add_hypotheses(self, outputs: list[list[int]], ranked: list[tuple[np.float32, int, int, int]],
                        ending: list[bool]) -> None:
        # Only the first W candidates may finish (HF's top_num_beam_mask); the rest are a reserve of live beams.
        if not self.improvement_possible or (self.early_stopping is True and len(self.hypotheses) == self.width):
            return
        length = np.float32((self.num_generated + 1) ** self.length_penalty)
        for (score, beam, _, token), ends in zip(ranked[: self.width], ending[: self.width]):
            if not ends:
                continue
            if token in self.stop_token_ids:
                reason, stop_reason = "stop", token
            elif token in self.eos_token_ids:
                reason, stop_reason = "stop", None
            else:
                reason, stop_reason = "length", None
            self.hypotheses.append(Hypothesis([*outputs[beam], token], score, np.float32(score / length),
                                              reason, stop_reason))
        # Stable: an older hypothesis wins a tie, as HF's merge puts the kept ones first.
        self.hypotheses.sort(key=lambda hypothesis: -hypothesis.score)
        del self.hypotheses[self.width:]

    def _update_improvement(self, best_running: np.float32) -> None:
        """HF's early-stop heuristic: can the best live beam still beat the worst kept hypothesis?"""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_new_tokens
        else:
            best_length = self.num_generated
        best_possible = np.float32(best_running / np.float32(best_length ** self.length_penalty))
        worst = self.hypotheses[-1].score if len(self.hypotheses) == self.width else _NO_SCORE
        self.improvement_possible = self.improvement_possible and bool(best_possible > worst)
