"""Op cases: for every registered op, one call's arguments at a model shape, and how to run an implementation.

`benchmarks/bench_ops.py` times every implementation on these inputs and `tests/kernels/test_op_numerics.py`
compares each with torch_ref on them, so both see the same calls. A case may have variants (linear's
projections, the sampling filter's parameter mixes, attention's decode, extend and prefill batches), restrict its
dtypes, and declare `prepare`, run once per implementation outside the timed call (for implementations that
keep a weight in their own format), and `run`, one call (attention: the backend's build_metadata, then one
layer's forward over a paged KV cache). Inputs come from a seeded CPU generator, so every device sees the
same values (op_case_inputs.py); the state ops' cases are in state_op_cases.py. Adding an op = a builder here
and one OP_CASES entry (a test checks every op has one).
Usage: `case = OP_CASES["rms_norm"]; args = case.prepare(fn, case.build(CaseConfig(SHAPES["llama-10m"], 8,
torch.bfloat16, cpu), "").args); case.run(fn, args)`.
"""

from __future__ import annotations

from typing import Any

import torch

from rapid_llm.ops.attention.backend import StepLayout
from rapid_llm.ops.attention.dsv4_backend import CompressorInputs, IndexerQuery
from rapid_llm.ops.attention.kv_cache_spec import DeepseekV4Spec
from rapid_llm.ops.attention.mla_backend import MLADims
from rapid_llm.ops.fp4_linear import Fp4LinearSpec, fp4_linear
from rapid_llm.ops.fp8_linear import Fp8LinearSpec, fp8_linear
from rapid_llm.ops.int4_linear import Int4LinearSpec
from rapid_llm.ops.multi_lora import lora_indices
from rapid_llm.ops.op_case_inputs import CaseConfig, CaseInputs, ModelShape, OpCase, OpInputs
from rapid_llm.ops.state_op_cases import STATE_OP_CASES
from rapid_llm.ops.quant_moe import ExpertScales
from rapid_llm.quantization.fp4_math import mxfp4_quantize, nvfp4_global_scale, nvfp4_quantize
from rapid_llm.quantization.fp8_math import quantize_weight
from rapid_llm.quantization.int4_math import quantize_rtn


def _rms_norm(config: CaseConfig, variant: str) -> OpInputs:
    inputs, t, h = CaseInputs(config), config.num_tokens, config.shape.hidden_size
    return OpInputs((inputs.randn(t, h), inputs.randn(h), 1e-6), f"[{t}, {h}]")


def _fused_add_rms_norm(config: CaseConfig, variant: str) -> OpInputs:
    inputs, t, h = CaseInputs(config), config.num_tokens, config.shape.hidden_size
    return OpInputs((inputs.randn(t, h), inputs.randn(t, h), inputs.randn(h), 1e-6), f"[{t}, {h}]")


def _silu_and_mul(config: CaseConfig, variant: str) -> OpInputs:
    inputs, t, i = CaseInputs(config), config.num_tokens, config.shape.intermediate_size
    return OpInputs((inputs.randn(t, 2 * i),), f"[{t}, {2 * i}]")


def _rotary_embedding(config: CaseConfig, variant: str) -> OpInputs:
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    rotary_dim = shape.head_dim // 2 if variant.endswith("partial") else shape.head_dim  # the rest passes
    angles = torch.rand(t, 1, rotary_dim // 2, generator=inputs.generator) * 6
    cos, sin = (table.to(config.device, config.dtype) for table in (angles.cos(), angles.sin()))
    query = inputs.randn(t, shape.num_heads * shape.head_dim)
    key = inputs.randn(t, shape.num_kv_heads * shape.head_dim)
    is_neox_style = not variant.startswith("gptj")
    return OpInputs((query, key, cos, sin, shape.head_dim, rotary_dim, is_neox_style),
                    f"q[{t}, {query.shape[1]}] k[{t}, {key.shape[1]}] rot {rotary_dim}"
                    + ("" if is_neox_style else " gpt-j"))


def _linear_dims(shape: ModelShape, variant: str) -> tuple[int, int, bool]:
    """(in, out, bias) of a model's projection."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {"qkv": (shape.hidden_size, q + 2 * kv, True),  # with Qwen2's bias
            "o": (q, shape.hidden_size, False),
            "gate_up": (shape.hidden_size, 2 * shape.intermediate_size, False),
            "down": (shape.intermediate_size, shape.hidden_size, False)}[variant]


def _linear_prepared(kernel: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The weight in the kernel's own format, as linear layers hold it (rapid_llm/ops/linear_kernel.py)."""
    x, weight, bias = args
    return x, kernel.prepare(weight), bias


def _linear(config: CaseConfig, variant: str) -> OpInputs:
    inputs, t = CaseInputs(config), config.num_tokens
    d_in, d_out, bias = _linear_dims(config.shape, variant)
    args = (inputs.randn(t, d_in), inputs.randn(d_out, d_in, scale=d_in**-0.5), inputs.randn(d_out) if bias else None)
    return OpInputs(args, f"[{t}, {d_in}] x [{d_out}, {d_in}]" + (" + bias" if bias else ""))


def _fp8_linear(config: CaseConfig, variant: str) -> OpInputs:
    """The gate_up projection's weight quantized to FP8 in one format; "static" uses a per-tensor input_scale."""
    inputs, t = CaseInputs(config), config.num_tokens
    d_in, d_out, _ = _linear_dims(config.shape, "gate_up")
    block = {"block128": (128, 128), "block32": (32, 32), "block32-ue8m0": (32, 32)}.get(variant)
    ue8m0 = variant.endswith("ue8m0")
    weight, scale = quantize_weight(inputs.randn(d_out, d_in, scale=d_in**-0.5, dtype=torch.float32), block, ue8m0,
                                    per_row=variant == "row")
    x = inputs.randn(t, d_in)
    input_scale = (x.float().abs().amax() / 448).reshape(()) if variant == "static" else None
    spec = Fp8LinearSpec(block, variant == "static", block[1] if block else None, ue8m0)
    args = (x, weight.to(config.device), scale.to(config.device), input_scale, spec, inputs.randn(d_out))
    return OpInputs(args, f"[{t}, {d_in}] x fp8 [{d_out}, {d_in}] {variant}")


def _int4_linear(config: CaseConfig, variant: str) -> OpInputs:
    """The gate_up projection's weight as int4 (round-to-nearest; groups of 32 or one per row), W4A16 or W4A8."""
    inputs, t = CaseInputs(config), config.num_tokens
    d_in, d_out, _ = _linear_dims(config.shape, "gate_up")
    group = d_in if variant.endswith("per-channel") else 32
    q, scales, zeros = quantize_rtn(inputs.randn(d_out, d_in, scale=d_in**-0.5, dtype=torch.float32), group,
                                    sym=variant.endswith("sym"))
    spec = Int4LinearSpec(group, variant.startswith("w4a8"))
    args = (inputs.randn(t, d_in), q.to(config.device), scales.to(config.device), zeros.to(config.device), spec,
            inputs.randn(d_out))
    return OpInputs(args, f"[{t}, {d_in}] x int4 [{d_out}, {d_in}] {variant}")


def _int4_linear_prepared(kernel: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The weight in the kernel's own format, as Int4LinearMethod prepares it."""
    x, q, scales, zeros, spec, bias = args
    return (x, *kernel.prepare(q, scales, zeros, spec.group_size, x.dtype), spec, bias)
def _fp4_linear(config: CaseConfig, variant: str) -> OpInputs:
    """The gate_up projection's weight in NVFP4 (weight only, or W4A4 with a static input scale) or MXFP4."""
    inputs, t = CaseInputs(config), config.num_tokens
    d_in, d_out, _ = _linear_dims(config.shape, "gate_up")
    w = inputs.randn(d_out, d_in, scale=d_in**-0.5, dtype=torch.float32)
    x = inputs.randn(t, d_in)
    if variant == "mxfp4":
        (weight, scale), weight_global, input_global = mxfp4_quantize(w), None, None
    else:
        weight, scale, weight_global = nvfp4_quantize(w)
        weight_global = weight_global.reshape(1, 1).to(config.device)
        input_global = nvfp4_global_scale(x.abs().amax()).to(config.device) if variant == "nvfp4-w4a4" else None
    spec = Fp4LinearSpec("mxfp4" if variant == "mxfp4" else "nvfp4", "nvfp4" if variant == "nvfp4-w4a4" else "none")
    args = (x, weight.to(config.device), scale.to(config.device), weight_global, input_global, spec,
            inputs.randn(d_out))
    return OpInputs(args, f"[{t}, {d_in}] x fp4 [{d_out}, {d_in}] {variant}")


def _kv_cache_store(config: CaseConfig, variant: str) -> OpInputs:
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    num_blocks = -(-t // shape.block_size) + 1
    cache = inputs.randn(2, num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    slots = inputs.randperm(num_blocks * shape.block_size)[:t]
    key, value = (inputs.randn(t, shape.num_kv_heads, shape.head_dim) for _ in range(2))
    return OpInputs((key, value, cache, slots), f"[{t}, {shape.num_kv_heads}, {shape.head_dim}] -> {num_blocks} blocks")


def _fused_moe(config: CaseConfig, variant: str) -> OpInputs:
    """Tokens routed as a renormalised softmax top-k router routes them (distinct experts per token)."""
    inputs, shape, t, k = CaseInputs(config), config.shape, config.num_tokens, config.shape.experts_per_token
    e, h, i = shape.num_experts, shape.hidden_size, shape.moe_intermediate_size
    top_logits, topk_ids = inputs.randn(t, e, dtype=torch.float32).topk(k, dim=-1)
    topk_weights = top_logits.softmax(dim=-1).to(config.dtype)
    args = (inputs.randn(t, h), topk_weights, topk_ids, inputs.randn(e, 2 * i, h, scale=h**-0.5),
            inputs.randn(e, h, i, scale=i**-0.5))
    return OpInputs(args, f"[{t}, {h}] {e} experts top-{k} inter {i}")


def _expert_all_to_all(config: CaseConfig, variant: str) -> OpInputs:
    """Pairs routed to random slots of one rank; the stand-in expert scales each row by its weight and adds its
    slot, so a row combined into the wrong token or with the wrong slot shows."""
    inputs, shape, t, k = CaseInputs(config), config.shape, config.num_tokens, config.shape.experts_per_token
    slots = torch.randint(0, shape.num_experts, (t, k), generator=inputs.generator).to(config.device)
    args = (inputs.randn(t, shape.hidden_size), inputs.randn(t, k), slots, shape.num_experts)
    return OpInputs(args, f"[{t}, {shape.hidden_size}] top-{k} over {shape.num_experts} slots, one rank")


def _expert_all_to_all_step(dispatcher: Any, args: tuple[Any, ...]) -> torch.Tensor:
    x, weights, slots, slots_per_rank = args
    dispatched = dispatcher.dispatch(x, weights, slots, slots_per_rank)
    expert_output = dispatched.hidden * dispatched.weights.unsqueeze(1) + dispatched.local_slots.unsqueeze(1)
    return dispatcher.combine(expert_output.to(x.dtype), dispatched, x.shape[0])


def _fused_moe_prepared(kernel: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The expert weights in the kernel's own format, as FusedExperts holds them (rapid_llm/ops/moe_kernel.py)."""
    x, topk_weights, topk_ids, w13, w2 = args
    return (x, topk_weights, topk_ids, *kernel.prepare(w13, w2))


def _expert_scales(weights: torch.Tensor, variant: str, device: torch.device) -> tuple[torch.Tensor, ExpertScales]:
    """Every expert's matrix of `weights` [E, N, K] (fp32) quantized in one format, and the scales binding it."""
    if variant.startswith("fp8"):
        block = (32, 32) if "block32" in variant else None
        pairs = [quantize_weight(w, block, variant.endswith("ue8m0"), per_row=block is None) for w in weights]
        spec = Fp8LinearSpec(block, False, block[1] if block else None, variant.endswith("ue8m0"))
        packed, scale = torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
        return packed.to(device), ExpertScales(fp8_linear, (scale.to(device), None), spec)
    if variant == "mxfp4":
        packed, scale = mxfp4_quantize(weights)
        return packed.to(device), ExpertScales(fp4_linear, (scale.to(device), None, None), Fp4LinearSpec("mxfp4"))
    triples = [nvfp4_quantize(w) for w in weights]
    packed, scale = torch.stack([t[0] for t in triples]), torch.stack([t[1] for t in triples])
    weight_global = torch.stack([t[2] for t in triples]).reshape(-1, 1, 1)
    return packed.to(device), ExpertScales(fp4_linear, (scale.to(device), weight_global.to(device), None),
                                           Fp4LinearSpec("nvfp4"))


def _quantized_fused_moe(config: CaseConfig, variant: str) -> OpInputs:
    """fused_moe's routing with every expert's weights in one quantized format (inter rounded up to FP4 blocks)."""
    inputs, shape, t, k = CaseInputs(config), config.shape, config.num_tokens, config.shape.experts_per_token
    e, h, i = shape.num_experts, shape.hidden_size, -(-shape.moe_intermediate_size // 32) * 32
    top_logits, topk_ids = inputs.randn(t, e, dtype=torch.float32).topk(k, dim=-1)
    topk_weights = top_logits.softmax(dim=-1).to(config.dtype)
    w13, w13_scales = _expert_scales(inputs.randn(e, 2 * i, h, scale=h**-0.5, dtype=torch.float32), variant,
                                     config.device)
    w2, w2_scales = _expert_scales(inputs.randn(e, h, i, scale=i**-0.5, dtype=torch.float32), variant, config.device)
    args = (inputs.randn(t, h), topk_weights, topk_ids, w13, w2, w13_scales, w2_scales)
    return OpInputs(args, f"[{t}, {h}] {e} {variant} experts top-{k} inter {i}")


_LORA_SLOTS, _LORA_RANK = 4, 16
_LORA_RUN_SLOTS = (2, 0, -1, 2)  # "prefill": four runs of tokens; slot 2 in two of them, one run without adapter


def _lora(config: CaseConfig, variant: str) -> OpInputs:
    """Adapters on the q projection, added into the q columns of a merged qkv output (a strided slice): 4 slots of
    rank 16, slot 1 holding a rank-8 adapter zero-padded. "decode": each token a random slot or none; "prefill":
    contiguous runs of tokens, a sequence each, one adapter per run (_LORA_RUN_SLOTS)."""
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    h, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    lora_a = inputs.randn(_LORA_SLOTS, _LORA_RANK, h, scale=h**-0.5)
    lora_b = inputs.randn(_LORA_SLOTS, q, _LORA_RANK, scale=_LORA_RANK**-0.5)
    lora_a[1, _LORA_RANK // 2:] = 0
    lora_b[1, :, _LORA_RANK // 2:] = 0
    if variant == "decode":
        slots = torch.randint(-1, _LORA_SLOTS, (t,), generator=inputs.generator)
    else:
        slots = torch.tensor([_LORA_RUN_SLOTS[token * len(_LORA_RUN_SLOTS) // t] for token in range(t)],
                             dtype=torch.int64)
    indices = lora_indices(slots.to(config.device), _LORA_SLOTS)
    qkv = inputs.randn(t, q + 2 * kv)
    return OpInputs((inputs.randn(t, h), lora_a, lora_b, indices, qkv[:, :q]),
                    f"[{t}, {h}] -> q[{t}, {q}] of qkv, {_LORA_SLOTS} slots rank {_LORA_RANK}")


# Row parameters (top_k, top_p) per variant, repeated over the rows; 0 / 1.0 = off. "mixed" gives rows of one
# batch different filters: none, k=1, a tiny p, k with p, p alone.
_FILTER_ROWS = {
    "k50": [(50, 1.0)], "p0.9": [(0, 0.9)], "k50+p0.9": [(50, 0.9)], "p0.9-flat": [(0, 0.9)],
    "mixed": [(0, 1.0), (1, 1.0), (0, 1e-4), (40, 0.9), (0, 0.95), (300, 0.5)],
}


def _top_k_top_p_filter(config: CaseConfig, variant: str) -> OpInputs:
    """Logits of N(0, 6^2) put a 0.9 nucleus on ~10 (V=32000) to ~25 (V=151936) tokens, as a trained model's
    next-token distribution does; "flat" (N(0, 2^2)) on thousands, past torch_topk's candidates."""
    inputs, rows, vocab_size = CaseInputs(config), config.num_tokens, config.shape.vocab_size
    logits = inputs.randn(rows, vocab_size, scale=2.0 if variant.endswith("flat") else 6.0, dtype=torch.float32)
    params = [_FILTER_ROWS[variant][row % len(_FILTER_ROWS[variant])] for row in range(rows)]
    top_k = [min(k, vocab_size) if k > 0 else vocab_size for k, _ in params]
    top_p = torch.tensor([p if p < 1.0 else float("inf") for _, p in params], device=config.device)
    any_top_p = any(p < 1.0 for _, p in params)
    args = (logits, torch.tensor(top_k, device=config.device), top_p if any_top_p else None,
            max((k for k in top_k if k < vocab_size), default=0))
    return OpInputs(args, f"[{rows}, {vocab_size}]")


def _apply_token_bitmask(config: CaseConfig, variant: str) -> OpInputs:
    """A grammar's mask: "random" words (every bit pattern, sign bit included) or "sparse" (a JSON value's
    few allowed tokens); row 0 is all ones, what an unconstrained row of a mixed batch gets."""
    inputs, rows, vocab_size = CaseInputs(config), config.num_tokens, config.shape.vocab_size
    words = (vocab_size + 31) // 32
    generator = inputs.generator
    if variant == "random":
        bitmask = torch.randint(-(2**31), 2**31, (rows, words), generator=generator, dtype=torch.int64)
    else:
        allowed = torch.rand(rows, words * 32, generator=generator) < 0.01
        weights = torch.tensor([1 << bit for bit in range(32)], dtype=torch.int64)
        bitmask = (allowed.view(rows, words, 32).to(torch.int64) * weights).sum(-1)
        bitmask = torch.where(bitmask >= 2**31, bitmask - 2**32, bitmask)
    bitmask[0] = -1
    logits = inputs.randn(rows, vocab_size, dtype=torch.float32)
    return OpInputs((logits, bitmask.to(torch.int32).to(config.device)), f"[{rows}, {vocab_size}]")


_EXTEND_TOKENS = 8


def _paged_layout(inputs: CaseInputs, variant: str) -> tuple[StepLayout, int]:
    """A decode batch (one new token per sequence, each after context_len minus a few cached tokens), an
    extend batch (as decode, `_EXTEND_TOKENS` new tokens per sequence: a speculative verification step or a
    draft model's catch-up) or a prefill batch (a chunk after context_len cached tokens, plus a fresh prompt),
    over shuffled blocks; returns the layout and the cache's block count."""
    config, shape, t = inputs.config, inputs.config.shape, inputs.config.num_tokens
    if variant in ("decode", "extend"):
        per_seq = 1 if variant == "decode" else min(t, _EXTEND_TOKENS)
        query_lens = [per_seq] * (t // per_seq) + ([t % per_seq] if t % per_seq else [])
        cached = [max(config.context_len - row * 5 % shape.block_size, 0) for row in range(len(query_lens))]
    else:
        cached, query_lens = ([config.context_len, 0], [t - t // 2, t // 2]) if t > 1 else ([0], [1])
    seq_lens = [c + q for c, q in zip(cached, query_lens)]
    blocks_per_seq = [-(-n // shape.block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 1  # one the step never touches
    free = inputs.randperm(num_blocks).tolist()
    tables = [[free.pop() for _ in range(n)] for n in blocks_per_seq]
    return StepLayout(query_lens, seq_lens, tables, shape.block_size), num_blocks


def _layout_label(layout: StepLayout) -> str:
    return f"{len(layout.seq_lens)} seqs, {layout.num_tokens} new tokens, up to {max(layout.seq_lens)} keys"


def _attention(config: CaseConfig, variant: str) -> OpInputs:
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    layout, num_blocks = _paged_layout(inputs, variant)
    # Random history everywhere, also in slots past each sequence's length, which a backend must not read.
    cache = inputs.randn(2, num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    query = inputs.randn(t, shape.num_heads, shape.head_dim)
    key, value = (inputs.randn(t, shape.num_kv_heads, shape.head_dim) for _ in range(2))
    return OpInputs((layout, query, key, value, cache, shape.head_dim**-0.5, None), _layout_label(layout))


def _attention_step(backend: Any, args: tuple[Any, ...]) -> torch.Tensor:
    layout, query, key, value, cache, scale, sliding_window = args
    return backend.forward(query, key, value, cache, backend.build_metadata(layout, query.device), scale,
                           sliding_window)


def _mla_attention(config: CaseConfig, variant: str) -> OpInputs:
    """The attention batches over a latent cache; nope and value heads are head_dim wide."""
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    layout, num_blocks = _paged_layout(inputs, variant)
    dims = MLADims(shape.kv_lora_rank, shape.head_dim, shape.qk_rope_head_dim, shape.head_dim)
    cache = inputs.randn(num_blocks, shape.block_size, dims.latent_dim)
    query = inputs.randn(t, shape.num_heads, dims.qk_head_dim)
    latent = inputs.randn(t, dims.latent_dim)
    kv_b_weight = inputs.randn(shape.num_heads * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank,
                               scale=dims.kv_lora_rank**-0.5)
    return OpInputs((layout, query, latent, cache, kv_b_weight, dims, dims.qk_head_dim**-0.5), _layout_label(layout))


def _mla_attention_step(backend: Any, args: tuple[Any, ...]) -> torch.Tensor:
    layout, query, latent, cache, kv_b_weight, dims, scale = args
    return backend.forward(query, latent, cache, kv_b_weight, dims, backend.build_metadata(layout, query.device), scale)


def _attention_lse(config: CaseConfig, variant: str) -> OpInputs:
    """One decode query per sequence (or a causal chunk of 16) over context_len keys of one shared KV head, about
    half of them visible (a rank's share)."""
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    queries_per_seq = 16 if variant == "chunk" else 1
    num_seqs, keys = max(1, t // queries_per_seq), config.context_len
    queries = inputs.randn(num_seqs, shape.num_heads, queries_per_seq, shape.head_dim)
    key_mask = (torch.rand((num_seqs, 1, queries_per_seq, keys), generator=inputs.generator) < 0.5).to(config.device)
    return OpInputs((queries, inputs.randn(num_seqs, keys, shape.head_dim), inputs.randn(num_seqs, keys, shape.head_dim),
                     key_mask, shape.head_dim**-0.5), f"[{num_seqs}, {shape.num_heads}, {queries_per_seq}, {keys}]")


def _dsv4_pool(kv: torch.Tensor, gate: torch.Tensor, valid: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """A stand-in for a V4 compressor's pooling: gate-softmax over the current window's second series."""
    width = kv.shape[-1] // 2
    return (kv[:, -1, :, width:] * gate[:, -1, :, width:].softmax(dim=1)).sum(dim=1)


def _dsv4_attention(config: CaseConfig, variant: str) -> OpInputs:
    """The attention batches through a CSA layer (compressor at head_dim, indexer at head_dim / 2, rate 4, top-3,
    window 8): the step pools every window its tokens close and attends over window + selected entries."""
    inputs, shape, t = CaseInputs(config), config.shape, config.num_tokens
    layout, num_blocks = _paged_layout(inputs, variant)
    spec = DeepseekV4Spec(config.dtype, shape.head_dim, (shape.head_dim, shape.head_dim // 2), rate=4, overlap=True)
    cache = inputs.randn(num_blocks, shape.block_size, spec.elements_per_token)
    compressors = [CompressorInputs(inputs.randn(t, 2 * width), inputs.randn(t, 2 * width), _dsv4_pool)
                   for width in spec.compressor_widths]
    indexer = IndexerQuery(inputs.randn(t, shape.num_heads, shape.head_dim // 2), inputs.randn(t, shape.num_heads),
                           (shape.head_dim // 2) ** -0.5, top_k=3)
    args = (layout, inputs.randn(t, shape.num_heads, shape.head_dim), inputs.randn(t, shape.head_dim), compressors,
            indexer, inputs.randn(shape.num_heads), cache, spec, shape.head_dim**-0.5, 8)
    return OpInputs(args, _layout_label(layout))


def _dsv4_attention_step(backend: Any, args: tuple[Any, ...]) -> torch.Tensor:
    layout, query, kv, compressors, indexer, sinks, cache, spec, scale, window = args
    return backend.forward(query, kv, compressors, indexer, sinks, cache, spec,
                           backend.build_metadata(layout, query.device), scale, window)


OP_CASES: dict[str, OpCase] = {
    "rms_norm": OpCase(_rms_norm),
    "fused_add_rms_norm": OpCase(_fused_add_rms_norm),
    "silu_and_mul": OpCase(_silu_and_mul),
    "rotary_embedding": OpCase(_rotary_embedding, variants=("full", "partial", "gptj", "gptj-partial")),
    "linear": OpCase(_linear, variants=("qkv", "o", "gate_up", "down"), prepare=_linear_prepared),
    "fp8_linear": OpCase(_fp8_linear, variants=("tensor", "row", "static", "block128", "block32", "block32-ue8m0")),
    "int4_linear": OpCase(_int4_linear, variants=("w4a16-g32", "w4a16-g32-sym", "w4a16-per-channel", "w4a8-g32"),
                          prepare=_int4_linear_prepared),
    "fp4_linear": OpCase(_fp4_linear, variants=("nvfp4", "nvfp4-w4a4", "mxfp4")),
    "kv_cache_store": OpCase(_kv_cache_store, exact=True),
    "lora": OpCase(_lora, variants=("decode", "prefill")),
    "fused_moe": OpCase(_fused_moe, prepare=_fused_moe_prepared),
    "expert_all_to_all": OpCase(_expert_all_to_all, run=_expert_all_to_all_step),
    "quantized_fused_moe": OpCase(_quantized_fused_moe, variants=("fp8-row", "fp8-block32-ue8m0", "nvfp4", "mxfp4")),
    "top_k_top_p_filter": OpCase(_top_k_top_p_filter, variants=tuple(_FILTER_ROWS), dtypes=("float32",),
                                 why_dtypes="the sampler filters float32 logits", exact=True),
    "apply_token_bitmask": OpCase(_apply_token_bitmask, variants=("random", "sparse"), dtypes=("float32",),
                                  why_dtypes="the sampler masks float32 logits", exact=True),
    "attention": OpCase(_attention, variants=("decode", "extend", "prefill"), run=_attention_step),
    "attention_lse": OpCase(_attention_lse, variants=("decode", "chunk")),
    "mla_attention": OpCase(_mla_attention, variants=("decode", "prefill"), run=_mla_attention_step),
    "dsv4_attention": OpCase(_dsv4_attention, variants=("decode", "prefill"), run=_dsv4_attention_step),
    **STATE_OP_CASES,
}
