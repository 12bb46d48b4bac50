"""Tensor-parallel group facts and collectives; identities when running on one rank (pipeline stages:
`rapid_llm.distributed.pipeline`)."""

from rapid_llm.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tp_all_gather,
    tp_all_reduce,
    tp_broadcast,
    world_min,
)

__all__ = ["get_tp_rank", "get_tp_size", "tp_all_gather", "tp_all_reduce", "tp_broadcast", "world_min"]
