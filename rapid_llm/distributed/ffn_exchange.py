"""Attention-FFN disaggregation's exchange: attention ranks hand each MoE layer's input to the FFN ranks and get its
output back; the FFN ranks serve layer after layer, micro-batch after micro-batch, without a scheduler.

Ranks [0, A) are the attention ranks (their TP group), [A, A + F) the FFN ranks (theirs). Every forward starts with
a step announcement from attention rank 0 to all (`announce_step`: the token count of each micro-batch), then each
MoE layer of each micro-batch is one exchange on the world group: a broadcast of the hidden states from attention
rank 0 and a broadcast of the output from the first FFN rank (`exchange`, as one collective of the two-batch-overlap
executor). Both sides issue them in the same order: micro-batch A's pair, then B's, layer by layer; the FFN ranks
compute A while the attention ranks compute B's attention (distributed/micro_batch_overlap.py), the ping-pong of
MegaScale-Infer and Step-3's AFD.
Key design choice: broadcasts on the world group, not point-to-point: every rank takes part in the same ordered
collectives, gloo and NCCL alike, and F FFN ranks need no fan-out of their own.
Usage: attention side `announce_step([n_a, n_b], device)`, then `exchange(hidden)` per MoE layer (what a
SparseMoeBlock built under `building_afd(ATTENTION)` does); FFN side `serve_steps(blocks, hidden_size, dtype, device)`.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from rapid_llm.distributed.collective_timer import timed
from rapid_llm.distributed.micro_batch_overlap import run_collective

STOP = -1  # a step announcement that ends the FFN ranks' loop
MAX_MICRO_BATCHES = 2

ATTENTION, FFN = "attention", "ffn"  # the roles a model is built for

_BUILDING: ContextVar[str | None] = ContextVar("afd_role", default=None)
_attention_ranks = 0  # the world's attention ranks: the first FFN rank's index


@contextmanager
def building_afd(role: str | None) -> Iterator[None]:
    """MoE blocks built inside are this role's: ATTENTION (a stand-in that exchanges), FFN or None (whole)."""
    token = _BUILDING.set(role)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def afd_role() -> str | None:
    return _BUILDING.get()


def set_attention_ranks(count: int) -> None:
    """Record how many attention ranks the world has (the first FFN rank's index)."""
    global _attention_ranks
    _attention_ranks = count


def _ffn_root() -> int:
    return _attention_ranks


def announce_step(token_counts: Sequence[int], device: torch.device) -> list[int]:
    """Attention rank 0 tells every rank the token count of each micro-batch of the forward about to run (`STOP`:
    the FFN ranks leave their loop); every rank calls it and gets the counts."""
    counts = torch.zeros(MAX_MICRO_BATCHES, dtype=torch.int64, device=device)
    counts[:len(token_counts)] = torch.tensor(list(token_counts), dtype=torch.int64)
    with timed(device, name="afd_step"):
        dist.broadcast(counts, src=0)
    return [count for count in counts.tolist() if count]


class _Pair:
    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            if work is not None:
                work.wait()


def _exchange_pair(sent: torch.Tensor, received: torch.Tensor) -> Callable[[bool], _Pair]:
    def start(async_op: bool) -> _Pair:
        return _Pair([dist.broadcast(sent, src=0, async_op=async_op),
                      dist.broadcast(received, src=_ffn_root(), async_op=async_op)])
    return start


def exchange(hidden_states: torch.Tensor) -> torch.Tensor:
    """On an attention rank: the MoE layer's output for `hidden_states` [T, H], computed by the FFN ranks."""
    sent = hidden_states.contiguous()
    output = torch.empty_like(sent)
    run_collective(sent.device, "afd_exchange", _exchange_pair(sent, output))
    return output


def serve_steps(blocks: Sequence[torch.nn.Module], hidden_size: int, dtype: torch.dtype,
                device: torch.device) -> int:
    """On an FFN rank: serve forwards until the attention ranks announce `STOP`; returns the forwards served."""
    served = 0
    while True:
        counts = announce_step((), device)
        if counts and counts[0] == STOP:
            return served
        for block in blocks:
            for tokens in counts:
                hidden = torch.empty(tokens, hidden_size, dtype=dtype, device=device)
                dist.broadcast(hidden, src=0)
                output = block(hidden).contiguous()
                dist.broadcast(output, src=_ffn_root())
        served += 1
