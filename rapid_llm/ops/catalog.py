"""Every built-in op implementation, registered by name with its kernel as a "module:function" string.

Kept free of torch so the launcher can check --op-backend against it; a kernel's module is imported
only when dispatch first picks it. Adding an implementation = its file + one register_op call here.
torch_ref is the always-available reference (the correctness oracle) of every op.
"""

from __future__ import annotations

from typing import Any

from rapid_llm.ops.registry import register_op

REFERENCE = "torch_ref"

register_op(name="rms_norm", backend=REFERENCE, fn="rapid_llm.ops.norm:rms_norm")
register_op(name="rms_norm", backend="torch_fused", fn="rapid_llm.ops.rms_norm_fused:rms_norm", priority=-10,
            conditions={"dtype": ["fp32"]})
register_op(name="fused_add_rms_norm", backend=REFERENCE, fn="rapid_llm.ops.norm:fused_add_rms_norm")
register_op(name="silu_and_mul", backend=REFERENCE, fn="rapid_llm.ops.activation:silu_and_mul")
register_op(name="rotary_embedding", backend=REFERENCE, fn="rapid_llm.ops.rotary:rotary_embedding")
# State ops (ops/state_metadata.py: their last argument is the step's StateMetadata). Their torch forms other than
# the reference serve the steps they are shaped for: one token per sequence, or a prefill of at least one 64-token
# chunk.


def _one_token_each(*args: Any) -> bool:
    return args[-1].max_query_len == 1


def _long_prefill(*args: Any) -> bool:
    return args[-1].max_query_len >= 64


def _several_queries_equal_widths(*args: Any) -> bool:
    """attention_lse(queries [B, H, Q, D], keys [B, K, D], values [B, K, Dv], ...): more than one query per sequence,
    and values as wide as keys (the fused kernel's condition)."""
    return args[0].shape[2] > 1 and args[1].shape[-1] == args[2].shape[-1]


register_op(name="causal_conv", backend=REFERENCE, fn="rapid_llm.ops.state_conv:causal_conv")
register_op(name="causal_conv", backend="torch_decode", fn="rapid_llm.ops.state_conv:causal_conv_decode", priority=5,
            conditions={"predicate": _one_token_each})
register_op(name="gated_delta_rule", backend=REFERENCE, fn="rapid_llm.ops.gated_delta:gated_delta_rule")
register_op(name="gated_delta_rule", backend="torch_decode", fn="rapid_llm.ops.gated_delta:gated_delta_rule_decode",
            priority=5, conditions={"predicate": _one_token_each})
register_op(name="gated_delta_rule", backend="torch_chunked", fn="rapid_llm.ops.gated_delta:gated_delta_rule_chunked",
            priority=5, conditions={"predicate": _long_prefill})
# Mamba2's scan (ops/ssd.py): the chunked (SSD) form for the same long prefills.
register_op(name="ssd_scan", backend=REFERENCE, fn="rapid_llm.ops.ssd:ssd_scan")
register_op(name="ssd_scan", backend="torch_chunked", fn="rapid_llm.ops.ssd:ssd_scan_chunked", priority=5,
            conditions={"predicate": _long_prefill})
# Linear implementations are LinearKernels (rapid_llm/ops/linear_kernel.py): a layer selects one per weight and
# stores the weight in the kernel's format; `ops.linear` dispatches calls on checkpoint-layout weights.
register_op(name="linear", backend=REFERENCE, fn="rapid_llm.ops.linear_kernel:TORCH_LINEAR")
register_op(name="linear", backend="cpu_amx", fn="rapid_llm.ops.amx_linear:AMX_LINEAR", priority=30,
            conditions={"device": "cpu", "dtype": ["bf16"], "available": "rapid_llm.ops.amx_linear:amx_missing"})
register_op(name="linear", backend="cpu_avx512", fn="rapid_llm.ops.avx512_linear:AVX512_LINEAR", priority=25,
            conditions={"device": "cpu", "dtype": ["bf16"],
                        "available": "rapid_llm.ops.avx512_linear:avx512_missing"})
register_op(name="linear", backend="onednn", fn="rapid_llm.ops.onednn_linear:ONEDNN_LINEAR", priority=20,
            conditions={"device": "cpu", "dtype": ["bf16", "fp16"],
                        "available": "rapid_llm.ops.onednn_linear:onednn_half_kernels_missing"})
register_op(name="linear", backend="cpu_fp32", fn="rapid_llm.ops.cpu_half:CPU_FP32_LINEAR", priority=10,
            conditions={"device": "cpu", "dtype": ["bf16", "fp16"],
                        "available": "rapid_llm.ops.cpu_half:half_kernels_missing"})
# fp8_linear(x, fp8 weight, scales, input_scale, spec, bias): FP8 weight formats (rapid_llm/quantization/fp8_linear.py
# binds one to each quantized layer's scales). torch_ref dequantizes and runs F.linear in the activation dtype;
# cpu_table decodes the fp8 bytes by a table gather (the same values, faster on CPU).
register_op(name="fp8_linear", backend=REFERENCE, fn="rapid_llm.ops.fp8_linear:fp8_linear")
register_op(name="fp8_linear", backend="cpu_table", fn="rapid_llm.ops.fp8_linear:fp8_linear_table", priority=10,
            conditions={"device": "cpu"})
# int4_linear implementations are Int4Kernels (rapid_llm/ops/int4_linear.py) owning their weight format: GPTQ, AWQ
# and online int4 (rapid_llm/quantization/int4_linear.py). cpu_int4pack: torch's CPU int4 GEMM.
register_op(name="int4_linear", backend=REFERENCE, fn="rapid_llm.ops.int4_linear:TORCH_INT4")
register_op(name="int4_linear", backend="cpu_int4pack", fn="rapid_llm.ops.int4_linear:CPU_INT4PACK", priority=10,
            conditions={"device": "cpu", "dtype": ["fp32", "bf16", "fp16"],
                        "available": "rapid_llm.ops.int4_linear:int4pack_missing"})
# fp4_linear(x, packed weight, group scales, weight_global, input_global, spec, bias): NVFP4 / MXFP4 weights
# (rapid_llm/quantization/fp4_linear.py). torch_ref dequantizes and runs F.linear in the activation dtype;
# cpu_table decodes the e2m1 nibbles by table gathers (the same values, faster on CPU).
register_op(name="fp4_linear", backend=REFERENCE, fn="rapid_llm.ops.fp4_linear:fp4_linear")
register_op(name="fp4_linear", backend="cpu_table", fn="rapid_llm.ops.fp4_linear:fp4_linear_table", priority=10,
            conditions={"device": "cpu"})
# fused_moe implementations are MoEKernels (rapid_llm/ops/moe_kernel.py): FusedExperts selects one and stores the
# expert weights in its format, like linear layers; `ops.fused_moe` dispatches calls on checkpoint-layout weights.
register_op(name="fused_moe", backend=REFERENCE, fn="rapid_llm.ops.moe:TORCH_MOE")
register_op(name="fused_moe", backend="cpu_amx", fn="rapid_llm.ops.amx_moe:AMX_MOE", priority=30,
            conditions={"device": "cpu", "dtype": ["bf16"], "available": "rapid_llm.ops.amx_linear:amx_missing"})
register_op(name="fused_moe", backend="cpu_avx512", fn="rapid_llm.ops.amx_moe:AVX512_MOE", priority=25,
            conditions={"device": "cpu", "dtype": ["bf16"],
                        "available": "rapid_llm.ops.avx512_linear:avx512_missing"})
# quantized_fused_moe(x, topk_weights, topk_ids, w13, w2, w13_scales, w2_scales[, swiglu_limit]): routed experts kept
# quantized (rapid_llm/quantization/moe_method.py); torch_ref runs fused_moe's loop with fp8_linear / fp4_linear GEMMs.
register_op(name="quantized_fused_moe", backend=REFERENCE, fn="rapid_llm.ops.quant_moe:quantized_fused_moe")
# expert_all_to_all: an object with dispatch/combine moving (token, k) pairs to the expert-parallel rank of their
# slot and back (rapid_llm/distributed/expert_parallel.py); torch_ref is torch.distributed's all_to_all_single.
register_op(name="expert_all_to_all", backend=REFERENCE, fn="rapid_llm.distributed.expert_parallel:TORCH_ALL_TO_ALL")
# Every rank of the EP group (= the TP group) holds every token and its routing: no exchange, the block's all-reduce
# combines (rapid_llm/distributed/replicated_dispatch.py).
register_op(name="expert_all_to_all", backend="replicated_routing",
            fn="rapid_llm.distributed.replicated_dispatch:REPLICATED_ROUTING", priority=10)
register_op(name="kv_cache_store", backend=REFERENCE, fn="rapid_llm.ops.attention.backend:write_kv_cache")
# lora(x, lora_a, lora_b, indices, out): every token's adapter delta added in place into out (ops/multi_lora.py),
# over the step's tokens grouped by slot once (lora_indices). cpu_grouped runs two GEMMs per present slot; it reads the slot
# offsets back to the host, so it stays off CUDA, where the Triton form (below) walks the same groups.
register_op(name="lora", backend=REFERENCE, fn="rapid_llm.ops.multi_lora:lora")
register_op(name="lora", backend="cpu_grouped", fn="rapid_llm.ops.multi_lora:lora_grouped", priority=10,
            conditions={"device": "cpu"})
# Sampling: the sort-based reference and the topk one (same kept set; faster wherever the kept set is a
# small part of the vocabulary, i.e. top-k, or a nucleus inside its candidates).
register_op(name="top_k_top_p_filter", backend=REFERENCE, fn="rapid_llm.ops.top_k_top_p:top_k_top_p_filter")
register_op(name="top_k_top_p_filter", backend="torch_topk", fn="rapid_llm.ops.top_k_top_p:top_k_top_p_filter_topk",
            priority=10)
# Structured output: a grammar's token bitmask onto the logits; xgrammar's kernel wherever the library is installed.
register_op(name="apply_token_bitmask", backend=REFERENCE, fn="rapid_llm.ops.token_bitmask:apply_token_bitmask")
register_op(name="apply_token_bitmask", backend="xgrammar",
            fn="rapid_llm.ops.token_bitmask:apply_token_bitmask_xgrammar", priority=10, conditions={"lib": "xgrammar"})
# Attention's implementation is an AttentionBackend (metadata built once per step, then a forward per
# layer): the worker selects it once for the model's device and dtype and binds it to every layer.
register_op(name="attention", backend=REFERENCE, fn="rapid_llm.ops.attention.torch_ref:TORCH_REF_BACKEND")
# MLA (DeepSeek-V2/V3) caches one latent per token: its implementations are MLABackends
# (rapid_llm/ops/attention/mla_backend.py), selected once like attention's. A model uses one of the two ops.
# torch_absorbed folds kv_b_proj into the decode queries (no expansion of the history): the default on CPU;
# on CUDA the Triton one (below) absorbs every token.
register_op(name="mla_attention", backend=REFERENCE, fn="rapid_llm.ops.attention.mla_torch_ref:MLA_TORCH_REF_BACKEND")
register_op(name="mla_attention", backend="torch_absorbed",
            fn="rapid_llm.ops.attention.mla_absorbed:MLA_ABSORBED_BACKEND", priority=10)
# attention_lse(queries, keys, values, key_mask, scale) -> (output, log-sum-exp): attention over one share of the
# keys, for backends that merge shares (decode context parallelism); a kernel without the log-sum-exp cannot serve.
register_op(name="attention_lse", backend=REFERENCE, fn="rapid_llm.ops.attention.lse_attention:attention_lse")
register_op(name="attention_lse", backend="cpu_flash", fn="rapid_llm.ops.attention.lse_attention:attention_lse_flash",
            priority=10, conditions={"device": "cpu", "predicate": _several_queries_equal_widths})
# DeepSeek-V4's sliding + compressed sparse attention with sinks over one paged row per token: DeepseekV4Backends
# (rapid_llm/ops/attention/dsv4_backend.py), selected once like the others.
register_op(name="dsv4_attention", backend=REFERENCE,
            fn="rapid_llm.ops.attention.dsv4_torch_ref:DSV4_TORCH_REF_BACKEND")

# Triton kernels (rapid_llm/ops/triton/): the default on CUDA when triton is installed, above torch_ref.
# Elsewhere their device condition fails before anything is imported, so a CPU server never loads triton.
_TRITON = {"device": "cuda", "lib": "triton"}
_TRITON_PRIORITY = 20
register_op(name="rms_norm", backend="triton", fn="rapid_llm.ops.triton.norm:rms_norm", priority=_TRITON_PRIORITY,
            conditions=_TRITON)
register_op(name="fused_add_rms_norm", backend="triton", fn="rapid_llm.ops.triton.norm:fused_add_rms_norm",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="silu_and_mul", backend="triton", fn="rapid_llm.ops.triton.activation:silu_and_mul",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="rotary_embedding", backend="triton", fn="rapid_llm.ops.triton.rotary:rotary_embedding",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="kv_cache_store", backend="triton", fn="rapid_llm.ops.triton.kv_cache:write_kv_cache",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="attention", backend="triton", fn="rapid_llm.ops.attention.triton_backend:TRITON_BACKEND",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="fused_moe", backend="triton", fn="rapid_llm.ops.triton.fused_moe:TRITON_MOE",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="mla_attention", backend="triton", fn="rapid_llm.ops.attention.mla_triton:TRITON_MLA_BACKEND",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
# State ops: one form for decodes and prefills, kept states included.
register_op(name="causal_conv", backend="triton", fn="rapid_llm.ops.triton.causal_conv:causal_conv",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="gated_delta_rule", backend="triton", fn="rapid_llm.ops.triton.gated_delta:gated_delta_rule",
            priority=_TRITON_PRIORITY, conditions=_TRITON)
register_op(name="ssd_scan", backend="triton", fn="rapid_llm.ops.triton.ssd:ssd_scan", priority=_TRITON_PRIORITY,
            conditions=_TRITON)
register_op(name="lora", backend="triton", fn="rapid_llm.ops.triton.lora:lora", priority=_TRITON_PRIORITY,
            conditions=_TRITON)
# flash-linear-attention's chunked gated delta rule (ops/fla_gated_delta.py) takes the prefills of at least one
# 64-token chunk keeping no inner state, above the token-by-token Triton form. Unlike the optional libraries below
# it cannot be opt-in (a pin would hold for decodes too, where its predicate fails); its adapter matched torch_ref
# on a patched fla 0.5.2 under Triton's interpreter, not yet on a GPU, and `fla_missing` skips an fla that does not
# import (0.5.2 with Triton 3.9).


def _long_prefill_keeping_nothing(*args: Any) -> bool:
    return _long_prefill(*args) and args[-1].kept is None


register_op(name="gated_delta_rule", backend="fla", fn="rapid_llm.ops.fla_gated_delta:gated_delta_rule_fla",
            priority=_TRITON_PRIORITY + 5,
            conditions={"device": "cuda", "lib": "fla", "available": "rapid_llm.ops.fla_gated_delta:fla_missing",
                        "predicate": _long_prefill_keeping_nothing})
# Quantized linears: activations fake-quantized in one pass, then a GEMM that decodes the weight tile by tile
# (rapid_llm/ops/triton/quant_gemm.py); int4 keeps torch_ref's weight format.
for _op, _fn in (("fp8_linear", "quant_fp8_gemm:fp8_linear"), ("int4_linear", "quant_int4_gemm:TRITON_INT4"),
                 ("fp4_linear", "quant_fp4_gemm:fp4_linear")):
    register_op(name=_op, backend="triton", fn=f"rapid_llm.ops.triton.{_fn}", priority=_TRITON_PRIORITY,
                conditions=_TRITON)

# C++/CUDA extensions, built on first selection (`ops/cpp/jit.py`): `available` compiles or loads them
# then and turns a missing toolchain or a failed build into a skip reason.
# One CPU extension (ops/cpp/cpu_ops.py) holds the paged attention kernel and the fused per-layer ops.
_CPU_CPP = {"device": "cpu", "dtype": ["fp32", "bf16", "fp16"], "available": "rapid_llm.ops.cpp.cpu_ops:skip_reason"}
register_op(name="attention", backend="cpu_paged", fn="rapid_llm.ops.attention.cpu_paged:CPU_PAGED_BACKEND",
            priority=10, conditions=_CPU_CPP)
register_op(name="attention", backend="cpu_amx", fn="rapid_llm.ops.attention.cpu_paged:CPU_AMX_BACKEND",
            priority=15, conditions={"device": "cpu", "dtype": ["bf16"],
                                     "available": "rapid_llm.ops.amx_linear:amx_missing"})
for _op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "kv_cache_store"):
    register_op(name=_op, backend="cpu_cpp", fn=f"rapid_llm.ops.cpp.cpu_fused:{_op}", priority=10, conditions=_CPU_CPP)
# The state ops' decode steps in place on their state rows (ops/cpp/cpu_state.py), above the torch decode forms.
for _op in ("gated_delta_rule", "ssd_scan"):
    register_op(name=_op, backend="cpu_cpp", fn=f"rapid_llm.ops.cpp.cpu_state:{_op}_decode",
                priority=10, conditions={**_CPU_CPP, "predicate": _one_token_each})
# Above xgrammar's CPU kernel: 25-46x faster at [8, 8192] and [8, 151936] (bench_ops; docs/structured_output.md).
register_op(name="apply_token_bitmask", backend="cpu_cpp", fn="rapid_llm.ops.token_bitmask:apply_token_bitmask_cpu_cpp",
            priority=20, conditions=_CPU_CPP)
# Above cpu_grouped: A and B read once per call in their dtype, 2.4-9x faster at 8 tokens (ops/cpp/cpu_lora.py);
# fp32/fp16 calls of many tokens go to cpu_grouped's GEMMs from the wrapper.
register_op(name="lora", backend="cpu_cpp", fn="rapid_llm.ops.cpp.cpu_lora:lora", priority=20, conditions=_CPU_CPP)
register_op(name="silu_and_mul", backend="cuda_cpp", fn="rapid_llm.ops.cpp.cuda_activation:silu_and_mul",
            priority=10, conditions={"device": "cuda", "dtype": ["fp32", "bf16", "fp16"],
                                     "available": "rapid_llm.ops.cpp.cuda_activation:skip_reason"})
# Optional libraries, as thin adapters onto their public APIs (untested without the library and a GPU):
# below torch_ref, so they are opt-in (--op-backend) until a GPU check verifies them. flash_mla takes the decodes
# of the Triton MLA backend (chunks stay on its kernel), so it needs triton too; block size 64 only.
register_op(name="attention", backend="flash_attn", fn="rapid_llm.ops.attention.flash_attn:FLASH_ATTN_BACKEND",
            priority=-10, conditions={"device": "cuda", "sm": ">=8.0", "dtype": ["bf16", "fp16"], "lib": "flash_attn"})
register_op(name="attention", backend="flashinfer", fn="rapid_llm.ops.attention.flashinfer:FLASHINFER_BACKEND",
            priority=-10, conditions={"device": "cuda", "sm": ">=7.5", "dtype": ["bf16", "fp16"], "lib": "flashinfer"})
register_op(name="mla_attention", backend="flash_mla", fn="rapid_llm.ops.attention.flash_mla:FLASH_MLA_BACKEND",
            priority=-10, conditions={"device": "cuda", "sm": ">=9.0", "dtype": ["bf16", "fp16"], "lib": "flash_mla"})
register_op(name="linear", backend="deep_gemm", fn="rapid_llm.ops.deep_gemm_linear:DEEP_GEMM_LINEAR", priority=-10,
            conditions={"device": "cuda", "sm": ">=9.0", "dtype": "bf16", "lib": "deep_gemm"})
