"""quantize_model: give every quantizable linear layer of a freshly built model its quantization's linear method.

Runs between building the model and loading its weights. A layer is left in the model dtype when the config's
ignore list names it (a merged layer by its checkpoint matrices: all or none of them), or when it keeps its
checkpoint layout for other code to read (it overrides prepare_weights, e.g. MLA's kv_b_proj). Embeddings,
norms and the LM head are not linear layers here, so they stay unquantized. Fused MoE experts: an FP8
checkpoint's are refused (not supported yet); online quantization leaves them in the model dtype.
"""

from __future__ import annotations

import logging

from torch import nn

from rapid_llm.layers.linear import LinearBase
from rapid_llm.layers.moe.experts import FusedExperts
from rapid_llm.models.weight_mapping import checkpoint_name_of
from rapid_llm.quantization.base import QuantizationConfig, ignored_by

logger = logging.getLogger(__name__)


def _checkpoint_modules(name: str, layer: LinearBase, model: nn.Module) -> list[str]:
    stacked = getattr(model, "stacked_params", ())
    return [checkpoint_name_of(f"{name}.weight", shard_id, stacked).removesuffix(".weight")
            for shard_id in layer.shard_ids()]


def quantize_model(model: nn.Module, config: QuantizationConfig) -> None:
    experts = [name for name, module in model.named_modules() if isinstance(module, FusedExperts)]
    if experts and not config.online:
        raise ValueError(f"{config.name}: quantized MoE experts ({experts[0]}, ...) are not supported yet; "
                         "only dense models load from FP8 checkpoints")
    if experts:
        logger.info("%s: the %d MoE expert layers stay in the model dtype (expert quantization is not built yet)",
                    config.name, len(experts))
    quantized = 0
    for name, layer in model.named_modules():
        if not isinstance(layer, LinearBase) or type(layer).prepare_weights is not LinearBase.prepare_weights:
            continue
        skipped = {ignored_by(module, config.ignored) for module in _checkpoint_modules(name, layer, model)}
        if skipped == {True}:
            continue
        if len(skipped) > 1:
            raise ValueError(f"quantization_config ignores only some of the matrices merged into {name} "
                             f"({', '.join(_checkpoint_modules(name, layer, model))}); ignore all of them or none")
        try:
            layer.set_linear_method(config.linear_method())
        except ValueError as error:
            raise ValueError(f"{config.name}: linear layer {name}: {error}") from error
        quantized += 1
    logger.info("%s: %d linear layers quantized", config.name, quantized)
