"""Checkpoint-name -> parameter-name mapping, declared per model in one place.

A model lists which checkpoint matrices it stacks into one parameter (q/k/v into qkv_proj,
gate/up into gate_up_proj) as `StackedParam`s; everything else maps by identical name.
"""

from __future__ import annotations

from typing import NamedTuple


class StackedParam(NamedTuple):
    param: str  # module name in the model, e.g. "qkv_proj"
    checkpoint: str  # module name in the checkpoint, e.g. "q_proj"
    shard_id: str | int  # which slice of the stacked parameter it fills


LLAMA_STACKED_PARAMS: tuple[StackedParam, ...] = (
    StackedParam("qkv_proj", "q_proj", "q"),
    StackedParam("qkv_proj", "k_proj", "k"),
    StackedParam("qkv_proj", "v_proj", "v"),
    StackedParam("gate_up_proj", "gate_proj", 0),
    StackedParam("gate_up_proj", "up_proj", 1),
)

# Non-parameter tensors some older checkpoints carry; they are recomputed, never loaded.
IGNORED_CHECKPOINT_SUFFIXES: tuple[str, ...] = ("rotary_emb.inv_freq",)


def map_checkpoint_name(name: str, stacked: tuple[StackedParam, ...]) -> tuple[str, str | int | None]:
    """Return (parameter name, shard id) for a checkpoint tensor name."""
    parts = name.split(".")
    for entry in stacked:
        if entry.checkpoint in parts:
            parts[parts.index(entry.checkpoint)] = entry.param
            return ".".join(parts), entry.shard_id
    return name, None


def expected_shards(param_name: str, stacked: tuple[StackedParam, ...]) -> set[str | int | None]:
    """Shard ids a parameter must receive before it is fully loaded."""
    module = param_name.split(".")
    shard_ids = {entry.shard_id for entry in stacked if entry.param in module}
    return shard_ids or {None}


def checkpoint_name_of(param_name: str, shard_id: str | int | None, stacked: tuple[StackedParam, ...]) -> str:
    """The checkpoint tensor name a (parameter, shard) loads from, for error messages."""
    for entry in stacked:
        parts = param_name.split(".")
        if entry.shard_id == shard_id and entry.param in parts:
            parts[parts.index(entry.param)] = entry.checkpoint
            return ".".join(parts)
    return param_name
