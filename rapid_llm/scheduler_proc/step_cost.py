"""A step's cost, learnt from the worker's measured step times, and the prompt chunk that fits an ITL target.

A step costs about `a + b * tokens + c * pairs`, where `pairs` counts the (query, key) pairs causal attention
computes: a chunk of n new tokens after c computed ones has n*c + n*(n+1)/2. The three coefficients are fitted
to the steps measured so far (least squares with every coefficient kept non-negative, older steps weighted
less), so the model follows the machine, the model size and the thread count actually in use. With an ITL
target, `PrefillAllowance` cuts a step's prompt chunks while requests decode, so the predicted step stays within
it: a long prompt is prefilled in pieces between decode tokens instead of one step that stalls them all. And a
step where a prompt ends takes no further prompt once the step is long (below): first tokens come sooner.
Usage: `model.observe(step_features(chunks), seconds)`; `allowance = PrefillAllowance.start(model, target,
decodes)`, then `allowance.cap(...)` a chunk's length and `allowance.count(...)` the chunk scheduled.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterable

# Features are scaled to similar magnitudes before fitting (a 2048-token chunk after 6000 tokens has 1.4e7 pairs).
_TOKEN_SCALE = 1e-3
_PAIR_SCALE = 1e-6
# Each observation multiplies the weight of the earlier ones by this: about the last few hundred steps count.
_DECAY = 0.99
# No cut before the model has seen a step this large: a fit from decode steps alone extrapolates badly.
MIN_PREFILL_SEEN = 64
# The smallest prompt chunk a step is cut to, so a prompt always progresses (even when decodes alone exceed
# the target) and a step's weight reads are shared by a useful number of rows.
MIN_PREFILL_CHUNK = 128
# A step whose finished prompt costs this many times the step's constant part takes no other prompt.
PACKING_RATIO = 20.0


def attention_pairs(num_computed: int, num_new: int) -> int:
    """Causal (query, key) pairs of a chunk of `num_new` tokens after `num_computed`."""
    return num_new * num_computed + num_new * (num_new + 1) // 2


def step_features(chunks: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """(tokens, attention pairs) of a step from its chunks' (num_computed, num_new)."""
    tokens = pairs = 0
    for num_computed, num_new in chunks:
        tokens += num_new
        pairs += attention_pairs(num_computed, num_new)
    return tokens, pairs


class StepCostModel:
    """Predicted seconds of a step from its (tokens, pairs), refitted as measured steps arrive."""

    def __init__(self) -> None:
        self._gram = [[0.0] * 3 for _ in range(3)]  # weighted sum of x x^T
        self._moment = [0.0] * 3  # weighted sum of x * seconds
        self._largest_step = 0
        self._coefficients: list[float] | None = None
        self._stale = False  # refitted when next asked: most steps are only observed

    @property
    def ready(self) -> bool:
        return self._largest_step >= MIN_PREFILL_SEEN and self._fitted() is not None

    def observe(self, features: tuple[int, int], seconds: float) -> None:
        x = _scaled(features)
        for i in range(3):
            self._moment[i] = _DECAY * self._moment[i] + x[i] * seconds
            for j in range(3):
                self._gram[i][j] = _DECAY * self._gram[i][j] + x[i] * x[j]
        self._largest_step = max(self._largest_step, features[0])
        self._stale = True

    def predict(self, features: tuple[int, int]) -> float:
        return sum(c * x for c, x in zip(self._require_fit(), _scaled(features)))

    def chunk_seconds(self, num_computed: int, num_new: int) -> float:
        """What a chunk adds to a step's cost (the step's constant part left out)."""
        return self.predict((num_new, attention_pairs(num_computed, num_new))) - self._require_fit()[0]

    def max_new_tokens(self, num_computed: int, seconds: float) -> int:
        """The longest chunk after `num_computed` tokens that adds at most `seconds` to a step."""
        _, per_token, per_pair = self._require_fit()
        if seconds <= 0:
            return 0
        # per_pair * (n*c + n*(n+1)/2) + per_token * n <= seconds, in unscaled units: a*n^2 + b*n <= seconds.
        a = per_pair * _PAIR_SCALE / 2
        b = per_token * _TOKEN_SCALE + per_pair * _PAIR_SCALE * (num_computed + 0.5)
        if a == 0:
            return sys.maxsize if b == 0 else int(seconds / b)
        return int((-b + math.sqrt(b * b + 4 * a * seconds)) / (2 * a))

    def _fitted(self) -> list[float] | None:
        if self._stale:
            self._coefficients = _non_negative_fit(self._gram, self._moment)
            self._stale = False
        return self._coefficients

    def _require_fit(self) -> list[float]:
        coefficients = self._fitted()
        if coefficients is None:
            raise RuntimeError("the step cost model has no fit yet (no step observed)")
        return coefficients


class PrefillAllowance:
    """The prompt tokens one step may still take: two rules from the fitted cost.

    ITL target (when set and the step carries decodes): prompt chunks only while the predicted step stays
    within it. One finished prompt per long step: once a chunk that ends a prompt costs at least
    `PACKING_RATIO` times the step's constant part, no further prompt joins the step. Packing several prompts
    into a step whose time is linear in its tokens only delays the first one's first token (TTFT) without
    saving time; where the constant dominates (small models, GPUs) they are still packed.
    """

    def __init__(self, model: StepCostModel, target_seconds: float | None, decodes: list[tuple[int, int]]) -> None:
        self._model = model
        self._constant = model.predict((0, 0))
        protect = target_seconds is not None and decodes
        self._left = target_seconds - model.predict(step_features(decodes)) if protect else None
        self._granted = 0
        self._finished = False  # a prompt ended in this step with a chunk long enough to stop packing

    @classmethod
    def start(cls, model: StepCostModel, target_seconds: float | None,
              decodes: list[tuple[int, int]]) -> PrefillAllowance | None:
        """None (prompts cut by the token budget alone) until the model has a fit from a prompt-sized step."""
        return cls(model, target_seconds, decodes) if model.ready else None

    def cap(self, num_computed: int, wanted: int) -> int:
        """How many of `wanted` prompt tokens after `num_computed` this step may take."""
        if self._finished:
            return 0
        if self._left is None:
            return wanted
        fits = self._model.max_new_tokens(num_computed, self._left)
        smallest = min(wanted, MIN_PREFILL_CHUNK)
        if fits >= smallest:
            return min(wanted, fits)
        # Too little left for a useful chunk: the step's first prompt chunk still progresses, later ones wait.
        return smallest if self._granted == 0 else 0

    def count(self, num_computed: int, num_new: int, ends_prompt: bool) -> None:
        """A prompt chunk was scheduled: its cost comes off what is left."""
        seconds = self._model.chunk_seconds(num_computed, num_new)
        if self._left is not None:
            self._left -= seconds
        self._granted += num_new
        self._finished = ends_prompt and seconds >= PACKING_RATIO * self._constant


def _scaled(features: tuple[int, int]) -> list[float]:
    tokens, pairs = features
    return [1.0, tokens * _TOKEN_SCALE, pairs * _PAIR_SCALE]


def _non_negative_fit(gram: list[list[float]], moment: list[float]) -> list[float] | None:
    """Least squares over every subset of free coefficients (the rest zero), the best with none negative."""
    best: tuple[float, list[float]] | None = None
    for size in (1, 2, 3):
        for subset in itertools.combinations(range(3), size):
            solved = _solve([[gram[i][j] for j in subset] for i in subset], [moment[i] for i in subset])
            if solved is None or min(solved) < 0:
                continue
            coefficients = [0.0] * 3
            for index, value in zip(subset, solved):
                coefficients[index] = value
            # The weighted squared error, less the constant sum of seconds squared: -2 c.m + c^T G c.
            error = sum(-2 * coefficients[i] * moment[i] + coefficients[i] * sum(
                gram[i][j] * coefficients[j] for j in range(3)) for i in range(3))
            if best is None or error < best[0]:
                best = (error, coefficients)
    return None if best is None else best[1]


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is (nearly) singular."""
    size = len(rhs)
    rows = [matrix[i][:] + [rhs[i]] for i in range(size)]
    scale = max(abs(value) for row in matrix for value in row) or 1.0
    for column in range(size):
        pivot = max(range(column, size), key=lambda r: abs(rows[r][column]))
        if abs(rows[pivot][column]) < 1e-9 * scale:
            return None
        rows[column], rows[pivot] = rows[pivot], rows[column]
        for r in range(column + 1, size):
            factor = rows[r][column] / rows[column][column]
            for c in range(column, size + 1):
                rows[r][c] -= factor * rows[column][c]
    solution = [0.0] * size
    for r in range(size - 1, -1, -1):
        solution[r] = (rows[r][size] - sum(rows[r][c] * solution[c] for c in range(r + 1, size))) / rows[r][r]
    return solution
