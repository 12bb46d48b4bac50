"""quantize_model: give every quantizable linear layer and every layer of routed experts of a freshly built model
its quantization's linear or MoE method.

Runs between building the model and loading its weights. A layer is left in the model dtype when the config's
ignore list names it (a merged layer by its checkpoint matrices, experts by every expert's gate/up/down: all or
none of them), or when it keeps its checkpoint layout for other code to read (it overrides prepare_weights, e.g.
MLA's kv_b_proj). Embeddings, norms, routers and the LM head are not quantized. Routed experts take the
config's `moe_method()` (their own format under a mixed `expert_dtype`; None keeps them in the model dtype),
and the model's expert mapping learns the per-expert scale tensors that method loads.
"""

from __future__ import annotations

import logging

from torch import nn

from rapid_llm.layers.linear import LinearBase
from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.models.weight_mapping import checkpoint_name_of
from rapid_llm.quantization.base import QuantizationConfig, ignored_by
from rapid_llm.quantization.moe_method import expert_tensor_params

logger = logging.getLogger(__name__)
_EXPERT_MATRICES = (("w13_weight", "gate"), ("w13_weight", "up"), ("w2_weight", "down"))


def _checkpoint_modules(name: str, layer: nn.Module, model: nn.Module) -> list[str]:
    stacked = getattr(model, "stacked_params", ())
    if isinstance(layer, FusedExperts):
        shards = [(f"{name}.{param}", (expert, shard)) for expert in range(layer.num_experts)
                  for param, shard in _EXPERT_MATRICES]
    else:
        shards = [(f"{name}.weight", shard_id) for shard_id in layer.shard_ids()]
    return [checkpoint_name_of(param, shard_id, stacked).removesuffix(".weight") for param, shard_id in shards]


def _ignored(name: str, layer: nn.Module, model: nn.Module, config: QuantizationConfig) -> bool:
    modules = _checkpoint_modules(name, layer, model)
    skipped = {ignored_by(module, config.ignored) for module in modules}
    if len(skipped) > 1:
        raise ValueError(f"quantization_config ignores only some of the matrices merged into {name} "
                         f"({', '.join(modules[:6])}{', ...' if len(modules) > 6 else ''}); ignore all of them "
                         "or none")
    return skipped == {True}


def _quantize_experts(model: nn.Module, config: QuantizationConfig) -> None:
    quantized, suffixes = 0, set()
    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, FusedExperts)]
    for name, experts in layers:
        if _ignored(name, experts, model, config):
            continue
        try:
            method = config.moe_method()
            if method is None:
                logger.info("%s: the %d MoE expert layers stay in the model dtype", config.name, len(layers))
                return
            experts.set_moe_method(method)
        except ValueError as error:
            raise ValueError(f"{config.name}: MoE experts {name}: {error}") from error
        suffixes.update(method.checkpoint_suffixes)
        quantized += 1
    if suffixes:
        model.stacked_params = expert_tensor_params(model.stacked_params, suffixes) + tuple(model.stacked_params)
    if layers:
        logger.info("%s: %d of %d MoE expert layers quantized", config.name, quantized, len(layers))


def quantize_model(model: nn.Module, config: QuantizationConfig) -> None:
    _quantize_experts(model, config)
    quantized = 0
    for name, layer in model.named_modules():
        if not isinstance(layer, LinearBase) or type(layer).prepare_weights is not LinearBase.prepare_weights:
            continue
        if _ignored(name, layer, model, config):
            continue
        try:
            layer.set_linear_method(config.linear_method())
        except ValueError as error:
            raise ValueError(f"{config.name}: linear layer {name}: {error}") from error
        quantized += 1
    logger.info("%s: %d linear layers quantized", config.name, quantized)
