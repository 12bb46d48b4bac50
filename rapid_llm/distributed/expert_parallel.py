"""Expert parallelism: the layout MoE layers are built with, and the all-to-all that moves tokens to experts.

The expert-parallel group is the tensor-parallel group (vLLM's EP size = TP x DP, with DP 1 here), so every
rank holds the same hidden states after attention. Each rank takes a contiguous share of the tokens
(`token_share`), sends every (token, k) pair to the rank holding the chosen physical expert slot
(`AllToAllDispatcher.dispatch`, two `all_to_all_single` calls: the counts, then rows, slot ids and routing
weights), computes its experts on what it received, and sends the results back (`combine`). The layer then
all-reduces, which restores the full batch on every rank.
The dispatcher is the `expert_all_to_all` op (rapid_llm/ops/catalog.py; the layer selects it for its weights'
device and dtype), so a GPU library (DeepEP) can register a faster one with the same dispatch/combine; the default
is replicated_dispatch.py's, which moves nothing (every rank routes every token), this one is its torch_ref. The
layout reaches the MoE layers while the worker builds the model (`building_expert_parallel`): a context
variable, as `torch.device(...)` is a context for the same build.
Usage: `with building_expert_parallel(ExpertParallelLayout(eplb)): model = ...`.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from rapid_llm.config.eplb_config import EPLBConfig
from rapid_llm.distributed.micro_batch_overlap import run_collective
from rapid_llm.distributed.parallel_state import get_tp_group, get_tp_size


@dataclass(frozen=True)
class ExpertParallelLayout:
    """Experts partitioned over the tensor-parallel ranks; `eplb` set: redundant slots, balanced by load."""

    eplb: EPLBConfig | None = None

    @property
    def num_redundant_experts(self) -> int:
        return self.eplb.num_redundant_experts if self.eplb is not None else 0


_BUILDING: ContextVar[ExpertParallelLayout | None] = ContextVar("expert_parallel_layout", default=None)


@contextmanager
def building_expert_parallel(layout: ExpertParallelLayout | None) -> Iterator[None]:
    """MoE layers built inside partition their experts by `layout` (None: each expert is split by TP)."""
    token = _BUILDING.set(layout)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def expert_parallel_layout() -> ExpertParallelLayout | None:
    """The layout of the model being built, None when experts are not partitioned (or there is one rank)."""
    layout = _BUILDING.get()
    return layout if layout is not None and get_tp_size() > 1 else None


def token_share(num_tokens: int, rank: int, size: int) -> tuple[int, int]:
    """[start, end) of the tokens rank `rank` dispatches: contiguous, the first num_tokens % size ranks one more."""
    base, extra = divmod(num_tokens, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass
class Dispatched:
    """What a rank received (`hidden`, `local_slots`, `weights`: one row per pair) and how to send it back."""

    hidden: torch.Tensor
    local_slots: torch.Tensor
    weights: torch.Tensor
    source_tokens: torch.Tensor  # for each pair this rank sent, in sending order: its token in the share
    send_counts: list[int]
    recv_counts: list[int]


def _exchange(tensor: torch.Tensor, output_rows: int, output_splits: list[int],
              input_splits: list[int]) -> torch.Tensor:
    if get_tp_size() == 1:
        return tensor  # one rank keeps every pair (the op's single-process case, rapid_llm/ops/op_cases.py)
    output = tensor.new_empty((output_rows, *tensor.shape[1:]))
    contiguous = tensor.contiguous()
    run_collective(tensor.device, "all_to_all", lambda async_op: dist.all_to_all_single(
        output, contiguous, output_split_sizes=output_splits, input_split_sizes=input_splits, group=get_tp_group(),
        async_op=async_op))
    return output


class AllToAllDispatcher:
    """torch.distributed's all_to_all_single over the tensor-parallel group (gloo on CPU, NCCL on CUDA)."""

    def token_range(self, num_tokens: int, rank: int, size: int) -> tuple[int, int]:
        """The tokens rank `rank` dispatches: its contiguous share."""
        return token_share(num_tokens, rank, size)

    def dispatch(self, hidden: torch.Tensor, weights: torch.Tensor, physical: torch.Tensor,
                 slots_per_rank: int) -> Dispatched:
        """Send each pair (token t, k) of hidden [t, H], weights [t, k], physical slots [t, k] to the rank
        holding its slot; every rank calls this, with any number of tokens (zero included)."""
        size, top_k = get_tp_size(), physical.shape[1]
        flat = physical.flatten()
        order = (flat // slots_per_rank).argsort(stable=True)  # pairs grouped by destination rank
        send = torch.bincount(flat // slots_per_rank, minlength=size)
        send_counts = send.tolist()
        recv_counts = _exchange(send, size, [1] * size, [1] * size).tolist()
        rows = sum(recv_counts)
        source_tokens = order // top_k
        sorted_slots = flat.index_select(0, order)
        return Dispatched(
            hidden=_exchange(hidden.index_select(0, source_tokens), rows, recv_counts, send_counts),
            local_slots=_exchange(sorted_slots % slots_per_rank, rows, recv_counts, send_counts),
            weights=_exchange(weights.flatten().index_select(0, order), rows, recv_counts, send_counts),
            source_tokens=source_tokens, send_counts=send_counts, recv_counts=recv_counts)

    def combine(self, expert_output: torch.Tensor, dispatched: Dispatched, num_tokens: int) -> torch.Tensor:
        """The weighted expert outputs [received pairs, H] back to their senders, summed per token: [t, H]."""
        back = _exchange(expert_output, dispatched.source_tokens.numel(), dispatched.send_counts,
                         dispatched.recv_counts)
        output = expert_output.new_zeros(num_tokens, expert_output.shape[1])
        return output.index_add_(0, dispatched.source_tokens, back)


TORCH_ALL_TO_ALL = AllToAllDispatcher()
