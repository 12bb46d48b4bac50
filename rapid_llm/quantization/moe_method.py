"""MoEMethod: how quantized routed experts (FusedExperts) create, load and prepare their tensors.

The MoE counterpart of LinearMethod. `create_weights(experts)` runs before loading: it replaces the stacked
model-dtype `w13_weight` [E, 2I, H] / `w2_weight` [E, H, I] by the checkpoint's tensors, stacked the same way:
`w13_<name>` / `w2_<name>` for each tensor `<name>` a checkpoint stores per expert matrix (`weight`,
`weight_scale_inv`, ...), filled through the loader's per-expert shard ids (expert, gate | up | down); the
model's expert mapping gains those names (`expert_tensor_params`). Per-row tensors (weights, row and group
scales) stack gate's rows then up's; per-matrix scalars are [E, 2] (gate, up) and [E, 1] (down).
`prepare(experts)` runs once after loading: it quantizes (online) or repacks, leaves `w13_weight` / `w2_weight`
the packed weights and sets `experts.kernel` to a QuantizedMoEKernel (rapid_llm/ops/quant_moe.py) bound to
the scales. The per-format math is the linear methods' (fp8_math.py, fp4_math.py), shared, not repeated.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Iterable

import torch
from torch import nn

from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.models.weight_mapping import EXPERT, StackedParam
from rapid_llm.quantization.fp4_math import E8M0_BIAS
from rapid_llm.quantization.linear_method import set_parameter

PROJECTIONS = ("w13", "w2")  # gate|up stacked, and down
Convert = Callable[[torch.Tensor], torch.Tensor]


class MoEMethod:
    # the tensors besides `weight` a checkpoint stores per expert matrix, e.g. ("weight_scale_inv",)
    checkpoint_suffixes: tuple[str, ...] = ()

    def create_weights(self, experts: FusedExperts) -> None:
        raise NotImplementedError

    def prepare(self, experts: FusedExperts) -> None:
        raise NotImplementedError


def projection_shape(experts: FusedExperts, projection: str) -> tuple[int, int]:
    """(output rows, input columns) of one expert's w13 or w2."""
    if projection == "w13":
        return 2 * experts.intermediate_size, experts.hidden_size
    return experts.hidden_size, experts.intermediate_size


def shard_count(projection: str) -> int:
    return 2 if projection == "w13" else 1


def expert_tensor_params(stacked: Iterable[StackedParam], suffixes: Iterable[str]) -> tuple[StackedParam, ...]:
    """For every expert pattern `<...>.{e}.<proj>.weight` -> `<...>.<w13|w2>_weight`, the same stacking of the
    matrix's other tensors: `<proj>.<suffix>` -> `<w13|w2>_<suffix>` (e.g. weight_scale_inv, weight_scale_2)."""
    return tuple(StackedParam(entry.param.removesuffix("weight") + suffix,
                              entry.checkpoint.removesuffix("weight") + suffix, entry.shard_id, entry.num_experts)
                 for suffix in sorted(set(suffixes)) for entry in stacked
                 if EXPERT in entry.checkpoint and entry.checkpoint.endswith(".weight")
                 and entry.param.endswith("_weight"))


def _load_rows(experts: FusedExperts, rows_per_entry: int, convert: Convert | None, param: nn.Parameter,
               loaded: torch.Tensor, shard_id: object = None) -> None:
    expert, shard = experts.expert_shard(shard_id)
    copy_weight(experts.shard_rows(param, expert, shard, rows_per_entry), convert(loaded) if convert else loaded)


def _load_scalar(experts: FusedExperts, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    expert, shard = experts.expert_shard(shard_id)
    if loaded.numel() != 1:
        raise ValueError(f"a per-matrix scale holds one value, got shape {tuple(loaded.shape)}")
    copy_weight(param.data[expert, 1 if shard == "up" else 0], loaded.reshape(()))


def _device(experts: FusedExperts) -> torch.device:
    return next(experts.parameters()).device


def add_rows(experts: FusedExperts, name: str, shape: tuple[int, ...], dtype: torch.dtype, rows_per_entry: int = 1,
             convert: Convert | None = None) -> None:
    """Register `experts.<name>` [E, *shape] (dim 1: output rows, or tiles of `rows_per_entry` rows), loaded by
    expert and shard; `convert` turns a checkpoint tensor into the stored dtype (e.g. e8m0 bytes)."""
    if rows_per_entry > 1 and experts.intermediate_size % rows_per_entry:
        raise ValueError(f"moe_intermediate_size {experts.intermediate_size} is not a multiple of the "
                         f"{rows_per_entry}-row scale tiles, so gate's and up's scales would share a tile")
    set_parameter(experts, name, torch.empty(experts.num_experts, *shape, dtype=dtype,
                                             device=_device(experts)),
                  partial(_load_rows, experts, rows_per_entry, convert))


def add_scalars(experts: FusedExperts, name: str, projection: str) -> None:
    """Register `experts.<name>` fp32 [E, shards]: one value per checkpoint matrix (gate, up | down)."""
    set_parameter(experts, name, torch.empty(experts.num_experts, shard_count(projection), dtype=torch.float32,
                                             device=_device(experts)),
                  partial(_load_scalar, experts))


def rows_of_scalars(experts: FusedExperts, scalars: torch.Tensor, projection: str) -> torch.Tensor:
    """Per-matrix scales [E, shards] -> one per output row [E, rows, 1] (gate's and up's rows differ)."""
    rows_per_shard = projection_shape(experts, projection)[0] // shard_count(projection)
    return scalars.float().repeat_interleave(rows_per_shard, dim=1).unsqueeze(-1)


def drop_checkpoint_tensors(experts: FusedExperts, names: Iterable[str]) -> None:
    for name in names:
        if name in experts._parameters:
            delattr(experts, name)


def e8m0_bytes(loaded: torch.Tensor) -> torch.Tensor:
    """Power-of-two scales as e8m0 bytes (2 ** (b - 127)): from float8_e8m0fnu, bytes, or float values."""
    if loaded.dtype == torch.uint8:
        return loaded
    if loaded.dtype == torch.float8_e8m0fnu:
        return loaded.view(torch.uint8)
    exponent = torch.log2(loaded.float())
    if not torch.equal(exponent, torch.round(exponent)):
        raise ValueError("e8m0 scales must be powers of two, and these are not")
    return (exponent + E8M0_BIAS).clamp(0, 254).to(torch.uint8)


def as_bytes(loaded: torch.Tensor) -> torch.Tensor:
    """Packed FP4 codes stored as int8 (DeepSeek-V4, transformers) read as the same bytes."""
    return loaded.view(torch.uint8) if loaded.dtype == torch.int8 else loaded
