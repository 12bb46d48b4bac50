"""A decode program's layers as one C++ call (`llama_decode_layers`, ops/cpp/csrc/decode_layers.cpp).

`LlamaDecodeProgram`'s Python loop still spends ~70 µs a layer between its kernels on a 2-core CPU (module
attributes, the op registry's dispatch, pybind's conversions), while the second OpenMP thread spins or sleeps.
The C++ loop calls the same kernels of the CPU extension on the same tensors in the same order, so its hidden
states are bit-identical (tests/models/test_llama_decode_program.py). It takes a model only where every op of
every layer is one it mirrors: bf16 weights packed for the `cpu_amx` or `cpu_avx512` linear (the MLP's gated
form), the `cpu_cpp` norms, rotary and KV store, the `cpu_paged`/`cpu_amx` attention backend over a bf16 cache,
one tensor-parallel rank; otherwise `build_native_layers` says what differs and the program keeps its Python loop.
It snapshots the weights and the bound KV caches when built (the worker binds caches once, before).
Usage: `native, reason = build_native_layers(stack, layers, rope)`; `native(hidden, batch, metadata)` returns
the final norm's output, as the program's loop does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rapid_llm.layers.linear import MergedColumnParallelLinear
from rapid_llm.ops.amx_linear import AMX_LINEAR
from rapid_llm.ops.attention.cpu_paged import CpuPagedBackend
from rapid_llm.ops.avx512_linear import AVX512_LINEAR
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.registry import REGISTRY

if TYPE_CHECKING:
    from rapid_llm.layers.forward_batch import ForwardBatch
    from rapid_llm.layers.rotary_embedding import RotaryEmbedding
    from rapid_llm.models.llama import LlamaModel
    from rapid_llm.models.llama_decode_program import LayerCalls

_FUSED_OPS = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "kv_cache_store")


@dataclass(frozen=True, slots=True)
class NativeDecodeLayers:
    """The arguments of `llama_decode_layers` that do not change between steps."""

    layer_tensors: list[torch.Tensor | None]  # 13 a layer, in decode_layers.cpp's `Slot` order
    final_norm: torch.Tensor
    eps: list[float]  # input/post norm, q/k norm, final norm
    heads: list[int]  # query heads, kv heads, head_dim, rotary_dim
    is_neox_style: bool
    scale: float
    sliding_window: int
    amx: bool
    rope: RotaryEmbedding

    def __call__(self, hidden: torch.Tensor, batch: ForwardBatch, metadata: Any) -> torch.Tensor:
        cos, sin = self.rope.cos_sin(batch.positions, batch.token_seq_lens, hidden.dtype)
        seq_ids = torch.arange(metadata.seq_lens.shape[0], dtype=torch.int64)
        return CPU_OPS.load().llama_decode_layers(
            hidden, self.layer_tensors, self.final_norm, cos, sin, metadata.slot_mapping, metadata.query_start_loc,
            metadata.seq_lens, metadata.block_tables, seq_ids, self.eps, self.heads, self.is_neox_style, self.scale,
            self.sliding_window, self.amx)


class _Mismatch(Exception):
    """Why the C++ loop cannot mirror the model (caught in build_native_layers)."""


def _only(values: set[Any], what: str) -> Any:
    if len(values) != 1:
        raise _Mismatch(f"the layers differ in {what}")
    return next(iter(values))


def _layer_tensors(calls: LayerCalls, kernel: Any) -> list[torch.Tensor | None]:
    if calls.down is None:
        raise _Mismatch("an MLP is not the plain gated MLP")
    gate_up = calls.mlp.gate_up_proj
    linears = {"qkv_proj": calls.qkv, "o_proj": calls.o_proj, "gate_up_proj": gate_up, "down_proj": calls.down}
    for name, linear in linears.items():
        if linear.kernel is not kernel or linear.weight.dim() != 3:
            raise _Mismatch(f"{name} is not packed for the {kernel.kernel} kernel")
    if type(gate_up) is not MergedColumnParallelLinear or not kernel.fuses_silu_and_mul(gate_up.weight):
        raise _Mismatch("the MLP's gate_up has no gated kernel form")
    if calls.o_proj.tp_size != 1 or calls.down.tp_size != 1:
        raise _Mismatch("the row-parallel linears reduce over tensor-parallel ranks")
    kv_cache, backend = calls.attn.bound()
    if not isinstance(backend, CpuPagedBackend) or kv_cache.dtype != torch.bfloat16:
        raise _Mismatch("attention is not the cpu_paged backend over a bf16 cache")
    attention = calls.attention
    head_norms = attention.q_norm is not None and attention.k_norm is not None
    return [calls.input_norm.weight, calls.qkv.weight, calls.qkv.bias,
            attention.q_norm.weight if head_norms else None, attention.k_norm.weight if head_norms else None,
            calls.o_proj.weight, calls.o_proj.bias, calls.post_norm.weight, gate_up.weight, gate_up.bias,
            calls.down.weight, calls.down.bias, kv_cache]


def _native_layers(stack: LlamaModel, layers: tuple[LayerCalls, ...], rope: RotaryEmbedding) -> NativeDecodeLayers:
    if stack.embed_tokens.weight.dtype != torch.bfloat16:
        raise _Mismatch("the weights are not bf16")
    reason = CPU_OPS.skip_reason()
    if reason is not None:
        raise _Mismatch(f"the CPU extension is unavailable: {reason}")
    for op in _FUSED_OPS:
        backend = REGISTRY.select(op, torch.device("cpu"), torch.bfloat16).backend
        if backend != "cpu_cpp":
            raise _Mismatch(f"op {op} runs on {backend}, not cpu_cpp")
    kernel = layers[0].qkv.kernel
    if kernel not in (AMX_LINEAR, AVX512_LINEAR):
        raise _Mismatch("the linears are not packed for cpu_amx or cpu_avx512")
    tensors = [tensor for calls in layers for tensor in _layer_tensors(calls, kernel)]
    attns = [calls.attn for calls in layers]
    head_norms = [norm for calls in layers for norm in (calls.attention.q_norm, calls.attention.k_norm)
                  if calls.attention.q_norm is not None and calls.attention.k_norm is not None]
    qk_eps = _only({norm.eps for norm in head_norms}, "q/k norm eps") if head_norms else 0.0
    return NativeDecodeLayers(
        layer_tensors=tensors, final_norm=stack.norm.weight,
        eps=[_only({n.eps for c in layers for n in (c.input_norm, c.post_norm)}, "norm eps"), qk_eps, stack.norm.eps],
        heads=[_only({a.num_heads for a in attns}, "query heads"), _only({a.num_kv_heads for a in attns}, "kv heads"),
               _only({a.head_dim for a in attns}, "head_dim"), rope.rotary_dim],
        is_neox_style=rope.is_neox_style, scale=_only({a.scale for a in attns}, "attention scale"),
        sliding_window=_only({a.sliding_window or 0 for a in attns}, "sliding window"), amx=kernel is AMX_LINEAR,
        rope=rope)


def build_native_layers(stack: LlamaModel, layers: tuple[LayerCalls, ...],
                        rope: RotaryEmbedding) -> tuple[NativeDecodeLayers | None, str]:
    """The C++ form of the program's layer loop, or None and why the model's layers are not one it mirrors."""
    try:
        return _native_layers(stack, layers, rope), "layers in one C++ call"
    except _Mismatch as mismatch:
        return None, f"layers in Python: {mismatch}"
