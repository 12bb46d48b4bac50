"""Decode steps of a Llama-block model as one flat loop over its layers' ops (the CPU's stand-in for CUDA graphs).

CUDA graphs take the per-op launch cost off a GPU's decode step; on a CPU that cost is Python (a llama-10m batch-1
step, one thread: 0.7 ms in its kernels, 0.9 ms in module calls, parameter lookups and wrappers around them).
`LlamaDecodeProgram` runs the step as one loop that calls each layer's norms, linears, rotary and attention
through their own `forward` (skipping nn.Module's call machinery and the module-to-module hops), in
`LlamaDecoderLayer.forward`'s order, so its outputs are bit-identical to the eager forward's
(tests/models/test_llama_decode_program.py). Like a CUDA graph it runs the modules it found when built (a module
swapped in later is not seen). `build_decode_program` takes only models it mirrors exactly: every layer the
Llama block (LlamaAttention with unwrapped linears, plain RMSNorms; any MLP module, inlined when it is a plain
`GatedMLP`), one rotary table, one cache group, one pipeline stage, no forward hooks; otherwise it says why, and
decode steps run eagerly. Where every op is the CPU extension's, the loop runs as one C++ call instead
(llama_decode_native.py). The worker builds it on the CPU unless `--enforce-eager` or `--enable-torch-compile`.
Usage: `program, reason = build_decode_program(model)`; `program(forward_batch)` returns the final hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from rapid_llm.layers.attention import Attention
from rapid_llm.layers.forward_batch import ForwardBatch
from rapid_llm.layers.layernorm import RMSNorm
from rapid_llm.layers.linear import QKVParallelLinear, RowParallelLinear
from rapid_llm.layers.mlp import GatedMLP
from rapid_llm.layers.rotary_embedding import RotaryEmbedding
from rapid_llm.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from rapid_llm.models.llama_decode_native import NativeDecodeLayers, build_native_layers


HOOKS_REASON = "forward hooks are registered (e.g. a proposer reading intermediate hidden states)"


@dataclass(frozen=True, slots=True)
class LayerCalls:
    """One decoder layer's modules, resolved once."""

    input_norm: RMSNorm
    post_norm: RMSNorm
    attention: LlamaAttention
    qkv: QKVParallelLinear
    attn: Attention
    o_proj: RowParallelLinear
    mlp: nn.Module
    down: RowParallelLinear | None  # a plain GatedMLP's down projection; None: the MLP is called as a module


class LlamaDecodeProgram:
    """The forward of a `LlamaModel` without per-module dispatch (see the module doc): each module's own `forward`,
    called directly, minus the nn.Module call machinery and the lookups between the layers and their kernels."""

    def __init__(self, stack: LlamaModel, layers: list[LlamaDecoderLayer], rope: RotaryEmbedding,
                 native: bool = True) -> None:
        self.stack = stack
        self.layers = tuple(_resolve(layer) for layer in layers)
        self.rope = rope
        self.native: NativeDecodeLayers | None = None
        self.native_reason = "layers in Python: the C++ loop is off"
        if native:
            self.native, self.native_reason = build_native_layers(stack, self.layers, rope)

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        hidden = self.stack.embed_tokens(batch.input_ids)
        metadata = batch.metadata_for(self.layers[0].attn)
        if self.native is not None:
            return self.native(hidden, batch, metadata)
        rope = self.rope
        residual: torch.Tensor | None = None
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        for layer in self.layers:
            if residual is None:
                residual, normed = hidden, layer.input_norm.forward(hidden)
            else:
                normed, residual = layer.input_norm.forward(hidden, residual)
            attention = layer.attention
            q, k, v = layer.qkv.forward(normed).split_with_sizes(attention.split_sizes, dim=-1)
            q, k = attention.head_normed(q, k)
            if cos_sin is None:
                cos_sin = rope.cos_sin(batch.positions, batch.token_seq_lens, q.dtype)
            q, k = rope.rotate(q, k, *cos_sin)
            hidden = layer.o_proj.forward(layer.attn.forward(q, k, v, metadata))
            normed, residual = layer.post_norm.forward(hidden, residual)
            hidden = layer.mlp(normed) if layer.down is None else layer.down.forward(layer.mlp.activated(normed))
        hidden, _ = self.stack.norm.forward(hidden, residual)
        return hidden


def _resolve(layer: LlamaDecoderLayer) -> LayerCalls:
    attention, mlp = layer.self_attn, layer.mlp
    plain_mlp = type(mlp).forward is GatedMLP.forward and type(mlp.down_proj) is RowParallelLinear
    return LayerCalls(layer.input_layernorm, layer.post_attention_layernorm, attention, attention.qkv_proj,
                      attention.attn, attention.o_proj, mlp, mlp.down_proj if plain_mlp else None)


def _layer_mismatch(layer: nn.Module) -> str | None:
    """Why the program cannot mirror this decoder layer, or None."""
    if type(layer) is not LlamaDecoderLayer:
        return f"layer {type(layer).__name__} is not the Llama block"
    attention = layer.self_attn
    if type(attention) is not LlamaAttention:
        return f"attention {type(attention).__name__} is not LlamaAttention"
    checks = [("qkv_proj", attention.qkv_proj, QKVParallelLinear), ("o_proj", attention.o_proj, RowParallelLinear),
              ("attn", attention.attn, Attention), ("input_layernorm", layer.input_layernorm, RMSNorm),
              ("post_attention_layernorm", layer.post_attention_layernorm, RMSNorm)]
    checks += [(name, getattr(attention, name), RMSNorm) for name in ("q_norm", "k_norm")
               if getattr(attention, name) is not None]
    for name, module, kind in checks:
        if type(module) is not kind:
            return f"{name} is a {type(module).__name__} (a wrapper or another kind), not {kind.__name__}"
    return None


def _has_hooks(model: nn.Module) -> bool:
    global_hooks = (torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks)
    return any(global_hooks) or any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def build_decode_program(model: nn.Module, native: bool = True) -> tuple[LlamaDecodeProgram | None, str]:
    """The model's decode program, or None and why it cannot have one; `native=False` keeps its layer loop in
    Python even where the C++ loop (llama_decode_native.py) mirrors the model."""
    stack = getattr(model, "model", None)
    if type(stack) is not LlamaModel or type(model).forward is not LlamaForCausalLM.forward:
        return None, f"{type(model).__name__} is not a Llama-block model"
    if not (stack.split.is_first and stack.split.is_last):
        return None, "the model is split into pipeline stages"
    if type(stack.norm) is not RMSNorm:
        return None, f"the final norm is a {type(stack.norm).__name__}"
    layers = list(islice(stack.layers, stack.split.layers.start, stack.split.layers.stop))
    for index, layer in enumerate(layers):
        mismatch = _layer_mismatch(layer)
        if mismatch is not None:
            return None, f"layer {index}: {mismatch}"
    ropes = {id(layer.self_attn.rotary_emb) for layer in layers}
    rope = layers[0].self_attn.rotary_emb
    if len(ropes) != 1 or type(rope) is not RotaryEmbedding:
        return None, "the layers do not share one rotary table"
    if len({layer.self_attn.attn.cache_group for layer in layers}) != 1:
        return None, "the layers read more than one cache group (e.g. sliding-window and full attention)"
    if _has_hooks(model):
        return None, HOOKS_REASON
    program = LlamaDecodeProgram(stack, layers, rope, native)
    return program, f"{len(layers)} Llama layers, {program.native_reason}"
