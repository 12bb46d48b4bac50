"""Layer-by-layer GPTQ / AWQ over a transformers decoder (Llama, Qwen2/3, Mistral layouts), in fp32.

The inputs of decoder layer 0 are caught once for every calibration batch (a pre-hook stops the forward there);
then each layer in turn: hooks gather its linear layers' inputs (GPTQ: a Hessian per layer; AWQ: a row
sample), the layer's weights are quantized, and the layer re-runs with its dequantized weights to give the next
layer its inputs, so later layers compensate for earlier layers' error. Weights are replaced in place by their
dequantized values; `quantize_layers` returns each quantized linear's checkpoint tensors by module name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rapid_llm.quantization.int4_layouts import canonical_to_awq, canonical_to_gptq
from rapid_llm.quantization.int4_math import dequantize, quantize_rtn
from rapid_llm.quantize.awq import search_scales
from rapid_llm.quantize.gptq import HessianAccumulator, gptq_quantize

logger = logging.getLogger(__name__)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")
AWQ_ROWS = 4096  # calibration rows per linear input kept for the scale search


@dataclass(frozen=True)
class Settings:
    method: str  # "gptq" or "awq"
    group_size: int  # -1: per output channel
    sym: bool = False
    desc_act: bool = False
    damp: float = 0.01
    batch_size: int = 8


class _Caught(Exception):
    pass


def first_layer_inputs(model: nn.Module, samples: torch.Tensor, batch_size: int) -> list[tuple[tuple, dict]]:
    """(args, kwargs) decoder layer 0 is called with, per calibration batch."""
    caught: list[tuple[tuple, dict]] = []

    def catch(_: nn.Module, args: tuple, kwargs: dict) -> None:
        caught.append((args, kwargs))
        raise _Caught

    handle = model.model.layers[0].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        for batch in samples.split(batch_size):
            try:
                model(batch, use_cache=False)
            except _Caught:
                pass
    finally:
        handle.remove()
    return caught


def _run(layer: nn.Module, inputs: list[tuple[tuple, dict]]) -> list[tuple[tuple, dict]]:
    outputs = []
    for args, kwargs in inputs:
        out = layer(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        outputs.append(((out, *args[1:]), kwargs) if args else ((), {**kwargs, "hidden_states": out}))
    return outputs


class _InputRows:
    """An evenly spaced sample of the rows a linear layer sees (AWQ)."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        self.rows.append(x[:: max(1, x.shape[0] * 8 // AWQ_ROWS)])

    def sample(self) -> torch.Tensor:
        rows = torch.cat(self.rows)
        return rows[torch.linspace(0, rows.shape[0] - 1, min(AWQ_ROWS, rows.shape[0])).long()]


def _gather(layer: nn.Module, inputs: list[tuple[tuple, dict]], make: Any) -> dict[str, Any]:
    modules = {name: layer.get_submodule(name) for name in LINEARS}
    gathered = {name: make(module.in_features) for name, module in modules.items()}
    handles = [module.register_forward_hook(lambda _, args, __, g=gathered[name]: g.add(args[0].detach()))
               for name, module in modules.items()]
    try:
        with torch.no_grad():
            _run(layer, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return gathered


def _gptq_layer(layer: nn.Module, inputs: list, settings: Settings) -> dict[str, dict[str, torch.Tensor]]:
    hessians = _gather(layer, inputs, HessianAccumulator)
    tensors = {}
    for name in LINEARS:
        linear = layer.get_submodule(name)
        q, scales, zeros, g_idx = gptq_quantize(linear.weight.data, hessians[name].hessian(), settings.group_size,
                                                settings.sym, settings.desc_act, settings.damp,
                                                min_zero=0 if settings.sym else 1)
        index = g_idx.long()
        linear.weight.data = dequantize(q, scales[:, index], zeros[:, index], 1, torch.float32)
        tensors[name] = canonical_to_gptq(q, scales, zeros, g_idx)
    return tensors


def _fold(producer: nn.Module, consumers: list[nn.Module], scales: torch.Tensor) -> None:
    """producer's outputs / s, consumers' inputs * s: the float function is unchanged."""
    if isinstance(producer, nn.Linear):
        producer.weight.data /= scales[:, None]
        if producer.bias is not None:
            producer.bias.data /= scales
    else:
        producer.weight.data /= scales
    for consumer in consumers:
        consumer.weight.data *= scales[None, :]


def _awq_layer(layer: nn.Module, inputs: list, settings: Settings) -> dict[str, dict[str, torch.Tensor]]:
    rows = _gather(layer, inputs, lambda _: _InputRows())
    attention, mlp = layer.self_attn, layer.mlp
    pairs = [(layer.input_layernorm, "self_attn.q_proj", [attention.q_proj, attention.k_proj, attention.v_proj]),
             (layer.post_attention_layernorm, "mlp.gate_proj", [mlp.gate_proj, mlp.up_proj]),
             (mlp.up_proj, "mlp.down_proj", [mlp.down_proj])]
    if attention.v_proj.weight.shape == attention.o_proj.weight.shape:  # no grouped-query head sharing
        pairs.append((attention.v_proj, "self_attn.o_proj", [attention.o_proj]))
    with torch.no_grad():
        for producer, first, consumers in pairs:
            scales = search_scales(rows[first].sample(), [c.weight.data for c in consumers], settings.group_size)
            _fold(producer, consumers, scales)
    tensors = {}
    for name in LINEARS:
        linear = layer.get_submodule(name)
        group = linear.in_features if settings.group_size == -1 else settings.group_size
        q, scales, zeros = quantize_rtn(linear.weight.data, group, sym=False)
        linear.weight.data = dequantize(q, scales, zeros, group, torch.float32)
        tensors[name] = canonical_to_awq(q, scales, zeros)
    return tensors


def quantize_layers(model: nn.Module, samples: torch.Tensor, settings: Settings) -> dict[str, dict[str, torch.Tensor]]:
    """Quantize every decoder layer's linear layers in place; checkpoint tensors by module name."""
    layers = model.model.layers
    for index, layer in enumerate(layers):
        if not all(_has(layer, name) for name in LINEARS):
            raise ValueError(f"decoder layer {index} lacks one of {', '.join(LINEARS)}; only dense Llama-style "
                             "layers (no MoE experts) are quantized")
    with torch.no_grad():
        inputs = first_layer_inputs(model, samples, settings.batch_size)
    quantize = _gptq_layer if settings.method == "gptq" else _awq_layer
    tensors = {}
    for index, layer in enumerate(layers):
        for name, packed in quantize(layer, inputs, settings).items():
            tensors[f"model.layers.{index}.{name}"] = packed
        with torch.no_grad():
            inputs = _run(layer, inputs)
        logger.info("%s: decoder layer %d/%d quantized", settings.method, index + 1, len(layers))
    return tensors


def _has(layer: nn.Module, name: str) -> bool:
    try:
        return isinstance(layer.get_submodule(name), nn.Linear)
    except AttributeError:
        return False
