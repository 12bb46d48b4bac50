"""The collective timer counts every tensor-parallel collective on a 2-rank gloo group, and its time is real:
a rank that waits for a late peer inside an all-reduce is charged the wait."""

from __future__ import annotations

import time

import torch

from rapid_llm.distributed import get_tp_rank, tp_all_gather, tp_all_reduce, tp_broadcast
from rapid_llm.distributed.collective_timer import collective_totals
from tests.distributed.ranks import run_on_ranks

LATE_S = 0.3


def _collectives(_: None) -> dict:
    start_seconds, start_calls = collective_totals()
    tensor = torch.ones(4)
    tp_all_reduce(tensor)
    tp_broadcast(tensor)
    tp_all_gather(tensor)
    if get_tp_rank() == 1:
        time.sleep(LATE_S)  # rank 0 waits for this inside the next all-reduce
    tp_all_reduce(tensor)
    seconds, calls = collective_totals()
    return {"calls": calls - start_calls, "seconds": seconds - start_seconds, "value": tensor[0].item()}


def test_every_collective_is_timed_and_waiting_counts(tmp_path) -> None:
    rank0, rank1 = run_on_ranks(_collectives, 2, tmp_path)
    assert rank0["calls"] == rank1["calls"] == 4
    assert rank0["value"] == rank1["value"] == 4.0
    assert rank0["seconds"] >= LATE_S * 0.9
    assert rank1["seconds"] < rank0["seconds"]
