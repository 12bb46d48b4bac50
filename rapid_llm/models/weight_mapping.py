"""Checkpoint-name -> parameter-name mapping, declared per model in one place.

A model lists which checkpoint matrices it stacks into one parameter (q/k/v into qkv_proj,
gate/up into gate_up_proj, every expert's gate/up/down into [E, ...] tensors) as `StackedParam`s,
and modules its checkpoint names differently as entries without a shard (Mixtral's
block_sparse_moe.gate -> mlp.gate); everything else maps by identical name. Names match as dotted runs
of path components; in a checkpoint pattern `{e}` stands for an expert's index, which becomes part of
the shard id. Tensors a model knowingly does not load (DeepSeek's MTP layers) are declared as
`SkippedKeys` with a reason; the loader never reads them and logs what it skipped.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from transformers import PretrainedConfig

EXPERT = "{e}"
ShardId = str | int | tuple[int, str | int]


class StackedParam(NamedTuple):
    param: str  # module name in the model, e.g. "qkv_proj" or "experts.w13_weight"
    checkpoint: str  # module name in the checkpoint, e.g. "q_proj" or "experts.{e}.gate_proj.weight"
    # which slice of the stacked parameter it fills ((expert, shard_id) for {e} patterns); None: a rename only
    shard_id: str | int | None
    num_experts: int = 0  # how many experts an {e} pattern covers


GATE_UP_STACKED_PARAMS: tuple[StackedParam, ...] = (
    StackedParam("gate_up_proj", "gate_proj", 0),
    StackedParam("gate_up_proj", "up_proj", 1),
)
# DeepSeek's MLA keeps its projections as they are named (its plain `q_proj` must not be stacked), so its
# models stack only the MLP's gate/up.
LLAMA_STACKED_PARAMS: tuple[StackedParam, ...] = (
    StackedParam("qkv_proj", "q_proj", "q"),
    StackedParam("qkv_proj", "k_proj", "k"),
    StackedParam("qkv_proj", "v_proj", "v"),
) + GATE_UP_STACKED_PARAMS


def expert_stacked_params(num_experts: int, checkpoint_module: str = "experts", param_module: str = "experts",
                          projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                          ) -> tuple[StackedParam, ...]:
    """Per-expert checkpoint matrices `{checkpoint_module}.{e}.{gate|up|down}.weight` stacked into a fused-MoE
    layer's `{param_module}.w13_weight` ([gate | up]) and `.w2_weight` (down); Mixtral names them
    block_sparse_moe.experts.{e}.w1/w3/w2. Listed before LLAMA_STACKED_PARAMS so `experts.{e}.gate_proj` is
    not taken for a dense gate_proj."""
    gate, up, down = projections
    return tuple(StackedParam(f"{param_module}.{param}", f"{checkpoint_module}.{EXPERT}.{proj}.weight", shard,
                              num_experts)
                 for param, proj, shard in (("w13_weight", gate, "gate"), ("w13_weight", up, "up"),
                                            ("w2_weight", down, "down")))


# Non-parameter tensors some older checkpoints carry; they are recomputed, never loaded.
IGNORED_CHECKPOINT_SUFFIXES: tuple[str, ...] = ("rotary_emb.inv_freq",)


class SkippedKeys(NamedTuple):
    """Checkpoint tensors a model knowingly does not load: names `pattern` matches in full, and why."""
    keys: str  # the names in words, whatever the config, for logs and docs/models
    pattern: str  # regular expression for this config, e.g. r"model\.layers\.(61)\..+"
    reason: str


MTP_REASON = "multi-token-prediction (MTP) layers, kept in the checkpoint for speculative decoding"


def mtp_layer_keys(config: PretrainedConfig, keys: str, prefix: str, use: str,
                   first: int = 0) -> tuple[SkippedKeys, ...]:
    """The MTP declaration for names `{prefix}{first + i}.*`, i < num_nextn_predict_layers (`prefix` a regular
    expression; `use`: what reads them, for the reason); none when the config has no MTP layers (DeepSeek-V2's
    has no such field)."""
    count = getattr(config, "num_nextn_predict_layers", 0) or 0
    if count == 0:
        return ()
    indices = "|".join(str(first + i) for i in range(count))
    return (SkippedKeys(keys, rf"{prefix}({indices})\..+", f"{MTP_REASON} ({use})"),)


def skipped_by(name: str, skipped: tuple[SkippedKeys, ...]) -> SkippedKeys | None:
    """The declaration that skips checkpoint tensor `name`, else None (the tensor must load)."""
    return next((entry for entry in skipped if re.fullmatch(entry.pattern, name)), None)


def _find(parts: list[str], pattern: list[str]) -> tuple[int, int | None] | None:
    """(start, expert index or None) of the first run of `parts` matching `pattern`, else None."""
    for start in range(len(parts) - len(pattern) + 1):
        window = parts[start:start + len(pattern)]
        if all(got == want or (want == EXPERT and got.isdigit()) for got, want in zip(window, pattern)):
            expert = next((int(got) for got, want in zip(window, pattern) if want == EXPERT), None)
            return start, expert
    return None


def _replace(name: str, old: str, new: str) -> tuple[str, int | None] | None:
    parts, pattern = name.split("."), old.split(".")
    found = _find(parts, pattern)
    if found is None:
        return None
    start, expert = found
    parts[start:start + len(pattern)] = new.split(".")
    return ".".join(parts), expert


def _shard_ids(entry: StackedParam) -> list[ShardId]:
    if EXPERT in entry.checkpoint:
        return [(expert, entry.shard_id) for expert in range(entry.num_experts)]
    return [entry.shard_id]


def map_checkpoint_name(name: str, stacked: tuple[StackedParam, ...]) -> tuple[str, ShardId | None]:
    """Return (parameter name, shard id) for a checkpoint tensor name."""
    for entry in stacked:
        found = _replace(name, entry.checkpoint, entry.param)
        if found is not None:
            param_name, expert = found
            return param_name, entry.shard_id if expert is None else (expert, entry.shard_id)
    return name, None


def expected_shards(param_name: str, stacked: tuple[StackedParam, ...]) -> set[ShardId | None]:
    """Shard ids a parameter must receive before it is fully loaded."""
    parts = param_name.split(".")
    shard_ids = {shard for entry in stacked if _find(parts, entry.param.split(".")) is not None
                 for shard in _shard_ids(entry)}
    return shard_ids or {None}


def checkpoint_name_of(param_name: str, shard_id: ShardId | None, stacked: tuple[StackedParam, ...]) -> str:
    """The checkpoint tensor name a (parameter, shard) loads from, for error messages."""
    for entry in stacked:
        if shard_id in _shard_ids(entry):
            expert = shard_id[0] if isinstance(shard_id, tuple) else None
            found = _replace(param_name, entry.param, entry.checkpoint.replace(EXPERT, str(expert)))
            if found is not None:
                return found[0]
    return param_name
