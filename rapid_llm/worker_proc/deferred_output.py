"""A step's sampled tokens on their way back to the host: the one device-to-host read of a step, deferred.

On CUDA the sampled ids (and logprobs) are copied into pinned host memory with `non_blocking=True` and an
event is recorded after the copy; `result()` waits on that event only. So the worker can launch the next
step (its inputs are already on the device: the token pool holds the sampled ids) before it reads this
one's. On the CPU there is no asynchronous device: the tensors are final when the sampler returns, and
`result()` only converts them to lists.

Usage:
    pending = PendingOutput(rows, sampled, asked, prompt_logprobs)
    output = pending.result()  # StepOutput; blocks (CUDA) until the copy is done
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rapid_llm.ipc.messages import PooledPrompt, PromptLogprobs, TokenLogprobs
from rapid_llm.layers.sampler import SamplerOutput


@dataclass
class StepOutput:
    """Sampled tokens of the requests that sampled this step; `rows` index the step's request list."""

    rows: list[int]
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    num_accepted: list[int] = field(default_factory=list)  # per row, drafts accepted; empty in steps without drafts
    draft_token_ids: list[list[int]] = field(default_factory=list)  # per row, a worker proposer's next drafts
    pooled: list[PooledPrompt] = field(default_factory=list)  # pooling requests whose prompt ended this step


class PendingOutput:
    def __init__(self, rows: list[int], sampled: SamplerOutput | None, asked: list[int | None],
                 prompt_logprobs: list[PromptLogprobs], num_accepted: torch.Tensor | None = None,
                 drafts: torch.Tensor | None = None, pooled: list[PooledPrompt] | None = None) -> None:
        self.rows, self.asked, self.prompt_logprobs = rows, asked, prompt_logprobs
        self.pooled = pooled or []
        self._event: torch.cuda.Event | None = None
        self._tensors: list[torch.Tensor] = []
        self._has_accepted = num_accepted is not None
        self._has_drafts = drafts is not None
        if sampled is None:
            return
        tensors = [sampled.token_ids, *(tensor for tensor in (num_accepted, drafts) if tensor is not None)]
        if sampled.logprobs is not None:
            tensors += [sampled.logprobs, sampled.top_token_ids, sampled.top_logprobs]
        if sampled.token_ids.device.type == "cuda":
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for target, source in zip(host, tensors):
                target.copy_(source, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            tensors = host
        self._tensors = tensors

    def result(self) -> StepOutput:
        if self._event is not None:
            self._event.synchronize()
        if not self._tensors:
            return StepOutput([], [], [], self.prompt_logprobs, pooled=self.pooled)
        token_ids = self._tensors[0].tolist()
        num_accepted = self._tensors[1].tolist() if self._has_accepted else []
        drafts = ([[token for token in row if token >= 0] for row in self._tensors[1 + self._has_accepted].tolist()]
                  if self._has_drafts else [])
        return StepOutput(self.rows, token_ids, self._logprobs_per_row(), self.prompt_logprobs, num_accepted, drafts,
                          self.pooled)

    def _logprobs_per_row(self) -> list[TokenLogprobs | None]:
        first = 1 + self._has_accepted + self._has_drafts
        if len(self._tensors) == first:
            return [None] * len(self.asked)
        logprobs, top_ids, top_values = (tensor.tolist() for tensor in self._tensors[first:])
        return [
            None if n is None else TokenLogprobs(logprobs[row], top_ids[row][:n], top_values[row][:n])
            for row, n in enumerate(self.asked)
        ]
