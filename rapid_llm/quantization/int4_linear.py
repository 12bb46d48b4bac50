"""Int4LinearMethod: GPTQ / AWQ int4 weights, or model-dtype weights quantized online, in any linear layer.

Checkpoint tensors (layouts in int4_layouts.py) load into parameters of the checkpoint's shapes: column-parallel
and merged layers take each shard's output columns (a packed-along-outputs tensor needs shards on multiples of 8
outputs, checked at creation), row-parallel layers their input rows and every group's scales and zeros, so
act-order groups need no alignment. GPTQ keeps one `g_idx` per merged shard: the shards share their input, so
act-order gives them one permutation, which `prepare` checks. `prepare` turns it all into the canonical form
(contiguous groups, plus an input permutation for act-order) and hands it to the `int4_linear` implementation
the registry picks (torch_ref when the pick cannot hold the layer's shapes).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import torch
from torch import nn

from rapid_llm.layers.weight_utils import copy_weight
from rapid_llm.ops.int4_linear import Int4Kernel, Int4LinearSpec
from rapid_llm.ops.linear_kernel import LinearKernel
from rapid_llm.ops.registry import REGISTRY
from rapid_llm.quantization.int4_config import Int4Config
from rapid_llm.quantization.int4_layouts import awq_to_canonical, contiguous_groups, gptq_to_canonical
from rapid_llm.quantization.int4_math import NIBBLES, quantize_rtn
from rapid_llm.quantization.linear_method import LinearMethod, set_parameter

logger = logging.getLogger(__name__)
CHECKPOINT_TENSORS = ("qweight", "qzeros", "scales", "g_idx")


class Int4LinearKernel(LinearKernel):
    """An `int4_linear` implementation bound to one layer's params and input permutation."""

    def __init__(self, impl: Int4Kernel, spec: Int4LinearSpec, params: torch.Tensor,
                 perm: torch.Tensor | None) -> None:
        self.impl, self.spec, self.params, self.perm = impl, spec, params, perm

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return self.impl(x, weight, self.params, self.spec, bias)


def _is_row_parallel(layer: nn.Module) -> bool:
    return hasattr(layer, "input_slice")


def _load(layer: nn.Module, in_dim: int | None, in_pack: int, out_dim: int, out_pack: int, param: nn.Parameter,
          loaded: torch.Tensor, shard_id: Any = None) -> None:
    """One checkpoint tensor whose input channels (or groups: in_dim None, kept whole) lie along `in_dim`
    `in_pack` per element and outputs along `out_dim` `out_pack` per element."""
    if _is_row_parallel(layer):
        if in_dim is not None:
            source, cols = layer.input_slice()
            loaded = loaded.narrow(in_dim, source // in_pack, cols // in_pack)
        copy_weight(param.data, loaded)
        return
    start, rows, source = layer.output_slice(shard_id)
    copy_weight(param.data.narrow(out_dim, start // out_pack, rows // out_pack),
                loaded.narrow(out_dim, source // out_pack, rows // out_pack))


def _load_g_idx(layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    if _is_row_parallel(layer):
        source, cols = layer.input_slice()
        loaded = loaded.narrow(0, source, cols)
    copy_weight(param.data[layer.shard_ids().index(shard_id)], loaded)


def _full_in_features(layer: nn.Module) -> tuple[int, int]:
    """(input features of the whole checkpoint matrix, first of them this rank holds)."""
    in_features = layer.weight.shape[1]
    if _is_row_parallel(layer):
        source, _ = layer.input_slice()
        return in_features * layer.tp_size, source
    return in_features, 0


class Int4LinearMethod(LinearMethod):
    def __init__(self, config: Int4Config) -> None:
        self.config = config

    def _group_size(self, layer: nn.Module) -> int:
        full_in, _ = _full_in_features(layer)
        group = full_in if self.config.group_size == -1 else self.config.group_size
        if full_in % group:
            raise ValueError(f"its {full_in} input features are not a whole number of int4 groups of {group}")
        return group

    def create_weights(self, layer: nn.Module) -> None:
        layer.params_dtype = layer.weight.dtype  # the model dtype: activations and scales
        config, group = self.config, self._group_size(layer)
        if config.online:
            return  # the model-dtype weight loads as usual; prepare quantizes it
        out_features, in_features = layer.weight.shape
        if in_features % NIBBLES:
            raise ValueError(f"{in_features} input features are not a multiple of 8 (int4 words)")
        for shard_id in layer.shard_ids():
            start, rows, source = layer.output_slice(shard_id)
            if start % NIBBLES or rows % NIBBLES or source % NIBBLES:
                raise ValueError(f"shard {shard_id!r} spans output rows {start}..{start + rows} (row {source} of the "
                                 "checkpoint matrix), not whole int4 words of 8 outputs")
        device, groups = layer.weight.device, _full_in_features(layer)[0] // group
        # The layers read their shapes from `weight`; a meta tensor keeps them without being loaded or stored.
        del layer.weight
        layer.weight = torch.empty(out_features, in_features, device="meta")
        int32 = {"dtype": torch.int32, "device": device}
        words = out_features // NIBBLES
        if config.layout == "gptq":
            set_parameter(layer, "qweight", torch.empty(in_features // NIBBLES, out_features, **int32),
                          partial(_load, layer, 0, NIBBLES, 1, 1))
            set_parameter(layer, "g_idx", torch.empty(len(layer.shard_ids()), in_features, **int32),
                          partial(_load_g_idx, layer))
        else:
            set_parameter(layer, "qweight", torch.empty(in_features, words, **int32),
                          partial(_load, layer, 0, 1, 1, NIBBLES))
        set_parameter(layer, "qzeros", torch.empty(groups, words, **int32), partial(_load, layer, None, 1, 1, NIBBLES))
        set_parameter(layer, "scales", torch.empty(groups, out_features, dtype=torch.float32, device=device),
                      partial(_load, layer, None, 1, 1, 1))

    def _canonical(self, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, Any]:
        config = self.config
        if config.online:
            q, scales, zeros = quantize_rtn(layer.weight.data, self._group_size(layer), config.sym)
            return q, scales, zeros, self._group_size(layer), None
        if config.layout == "gptq":
            q, scales, zeros = gptq_to_canonical(layer.qweight.data, layer.qzeros.data, layer.scales.data)
            g_idx = layer.g_idx.data
            if any(not torch.equal(g_idx[0], other) for other in g_idx[1:]):
                raise ValueError("the g_idx of the matrices merged into it differ; merged GPTQ matrices must share "
                                 "one act-order permutation")
            g_idx = g_idx[0]
        else:
            q, scales, zeros = awq_to_canonical(layer.qweight.data, layer.qzeros.data, layer.scales.data)
            _, first = _full_in_features(layer)
            g_idx = (first + torch.arange(q.shape[1], device=q.device)) // self._group_size(layer)
        return contiguous_groups(q, scales, zeros, g_idx)

    def prepare(self, layer: nn.Module) -> None:
        q, scales, zeros, group, perm = self._canonical(layer)
        for name in CHECKPOINT_TENSORS:
            if hasattr(layer, name):
                delattr(layer, name)
        out_features, in_features = q.shape
        selection = REGISTRY.select("int4_linear", q.device, layer.params_dtype)
        impl, why_not = selection.fn, selection.fn.skip_reason(out_features, in_features, group)
        if why_not is not None:
            logger.info("int4_linear %s skipped for a [%d, %d] weight (%s): torch_ref", selection.backend,
                        out_features, in_features, why_not)
            impl = REGISTRY.implementation("int4_linear", "torch_ref", q.device, layer.params_dtype).fn
        weight, params = impl.prepare(q, scales, zeros, group, layer.params_dtype)
        set_parameter(layer, "weight", weight)
        params = set_parameter(layer, "weight_params", params)
        if perm is not None:
            perm = set_parameter(layer, "input_perm", perm)
        layer.kernel = Int4LinearKernel(impl, Int4LinearSpec(group, self.config.activation_bits == 8), params, perm)
