"""Per-request values that layers read for each token of the current step (e.g. each row's LoRA adapter).

The decision (issue 29, item 3): no global forward context and no new argument through every linear layer.
The model runner owns one `StepRows`; a feature adds a named column computed from a request's sampling
parameters, and wraps the modules that need it, after the model is built, with a reference to the object
(as a LoRA layer would wrap a linear). Columns are per slot on the device (set when a request starts, reset
when it leaves); once per forward the runner gathers them to the step's tokens, so a wrapped module reads
`values(name)` [num_tokens] in its own forward. Logits are computed for a subset of the tokens (each sampled
row's last, or a piece of a prompt): before each `compute_logits` the runner names them (`select_logit_rows`),
and a wrapped LM head reads `logit_values(name)`. Model code does not change.
Usage: `rows.add_column("adapter", lambda params: index_of(params))`; in a wrapper, `rows.values("adapter")`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rapid_llm.sampling import SamplingParams


@dataclass
class _Column:
    value_of: Callable[[SamplingParams], int]
    default: int
    per_slot: torch.Tensor  # [max_num_seqs] int64 on the device
    per_token: torch.Tensor | None = None  # the current step's, after `begin_step`


class StepRows:
    def __init__(self, max_num_seqs: int, device: torch.device) -> None:
        self._max_num_seqs = max_num_seqs
        self._device = device
        self._columns: dict[str, _Column] = {}
        self._logit_rows: torch.Tensor | slice | None = None  # the step's tokens the next logits are for

    @property
    def active(self) -> bool:
        """Whether any column exists (without one the runner skips the per-step gather)."""
        return bool(self._columns)

    def add_column(self, name: str, value_of: Callable[[SamplingParams], int], default: int = 0) -> None:
        """A per-token int64 value named `name`: `value_of(params)` for a request's tokens, `default` for none."""
        if name in self._columns:
            raise ValueError(f"step row column {name!r} exists already")
        per_slot = torch.full((self._max_num_seqs,), default, dtype=torch.int64, device=self._device)
        self._columns[name] = _Column(value_of, default, per_slot)

    def start(self, slot: int, params: SamplingParams) -> None:
        for column in self._columns.values():
            column.per_slot[slot] = column.value_of(params)

    def release(self, slots: Sequence[int]) -> None:
        if slots:
            for column in self._columns.values():
                column.per_slot[list(slots)] = column.default

    def begin_step(self, slots: torch.Tensor, seq_index: torch.Tensor) -> None:
        """Gather every column to the step's tokens: `slots` [num_seqs] on the device, `seq_index` [num_tokens]
        (each token's sequence in the step, as the attention metadata has it)."""
        token_slots = slots[seq_index]
        for column in self._columns.values():
            column.per_token = column.per_slot[token_slots]
        self._logit_rows = None

    def select_logit_rows(self, rows: torch.Tensor | slice | None) -> None:
        """The step's tokens (indices or a slice; None: every one) whose hidden states the next logits are for."""
        self._logit_rows = rows

    def logit_values(self, name: str) -> torch.Tensor:
        """[rows] int64: column `name` for each row of the logits being computed (`select_logit_rows`)."""
        values = self.values(name)
        return values if self._logit_rows is None else values[self._logit_rows]

    def values(self, name: str) -> torch.Tensor:
        """[num_tokens] int64: column `name` for each token of the step being run."""
        column = self._columns.get(name)
        if column is None:
            raise KeyError(f"no step row column {name!r}; columns: {sorted(self._columns)}")
        if column.per_token is None:
            raise RuntimeError(f"step row column {name!r} is read outside a step")
        return column.per_token
