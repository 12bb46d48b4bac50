"""A pipeline stage before the last: the tokens the last stage sampled, received without waiting for them.

Each step that samples ends with the last stage broadcasting its tokens. An earlier stage posts its receive
(asynchronously) and goes on with the next micro-batch, whose requests are other ones (the scheduler never plans
a request whose token is not back); the tokens are recorded into the input batch (pool, penalty counts, length)
before any later step touches one of their slots, in arrival order (`settle`), or as soon as they have arrived.
Key design choice: a stage never blocks on tokens its next micro-batch does not read, so it computes while the
later stages do.
Usage: `tokens = StageTokens(input_batch, device)`; `tokens.expect(slots, positions)` after a step that samples;
`tokens.settle(slots)` before the next one changes or reads those slots.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch

from rapid_llm.distributed.pipeline import broadcast_sampled
from rapid_llm.worker_proc.input_batch import InputBatch


@dataclass
class _Incoming:
    slots: np.ndarray
    positions: np.ndarray
    token_ids: torch.Tensor
    work: object  # the asynchronous broadcast's handle (torch.distributed Work), None when already done

    def arrived(self) -> bool:
        return self.work is None or self.work.is_completed()


class StageTokens:
    def __init__(self, batch: InputBatch, device: torch.device) -> None:
        self.batch = batch
        self.device = device
        self._incoming: deque[_Incoming] = deque()

    def expect(self, slots: np.ndarray, positions: np.ndarray) -> None:
        """The last stage samples `slots` at `positions` in this step: post the receive of its tokens."""
        token_ids = torch.empty(slots.size, dtype=torch.int64, device=self.device)
        self._incoming.append(_Incoming(slots, positions, token_ids, broadcast_sampled(token_ids, async_op=True)))

    def settle(self, slots: Collection[int]) -> None:
        """Record every batch of tokens up to the last one that holds one of `slots` (waiting for them), and
        any later ones that have already arrived."""
        touched = set(slots)
        last = max((index for index, incoming in enumerate(self._incoming)
                    if not touched.isdisjoint(incoming.slots.tolist())), default=-1)
        while self._incoming and (last >= 0 or self._incoming[0].arrived()):
            incoming = self._incoming.popleft()
            last -= 1
            if incoming.work is not None:
                incoming.work.wait()
            slots_on_device = torch.from_numpy(incoming.slots).to(self.device)
            positions = torch.from_numpy(incoming.positions).to(self.device)
            self.batch.record_sampled(incoming.slots, slots_on_device, positions, incoming.token_ids)
