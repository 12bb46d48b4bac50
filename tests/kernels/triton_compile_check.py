"""Compile (without running) every Triton kernel for CUDA targets; `python -m tests.kernels.triton_compile_check`.

The interpreter runs kernels as Python, so it never sees what only a GPU build rejects (a global that is
not a constexpr, a tile below tl.dot's minimum, shared memory over budget). `triton.compile` needs no
GPU: it lowers to a cubin with the ptxas bundled in the wheel. Run in a process without
TRITON_INTERPRET (the kernels must be JIT functions); prints one line per kernel, exits 1 on an error.
"""

from __future__ import annotations

import sys
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rapid_llm.ops.triton import (activation, attention_decode, attention_prefill, causal_conv, fused_moe, gated_delta,
                                   kv_cache, lora, mla_attention, norm, quant_activation, quant_gemm, rotary, ssd)

SHARED_MEMORY_BUDGET = 100 * 1024  # consumer sm_8x parts; datacenter GPUs have more
# Arguments the launch sees 16-divisible at model shapes, which Triton's specialisation marks: whether a GEMM's
# loads vectorise and pipeline (so its shared memory) depends on it.
ALIGNED = {fused_moe._grouped_gemm_kernel: ("a_ptr", "b_ptr", "out_ptr", "a_row_stride", "b_expert_stride",
                                            "b_n_stride", "out_row_stride", "k")}
INDEX_POINTERS = {name: "*i64" for name in ("seq_ids_ptr", "query_start_ptr", "seq_lens_ptr", "block_tables_ptr",
                                            "slot_mapping_ptr")}


def _signature(fn: Any, dtype: str, constexprs: dict[str, Any], types: dict[str, str]) -> dict[str, str]:
    """Pointers `*dtype` (or as `types` says), other runtime arguments i32 unless `types` says otherwise."""
    return {name: "constexpr" if name in constexprs else types.get(name, f"*{dtype}" if name.endswith("_ptr") else "i32")
            for name in fn.arg_names}


def _cases() -> list[tuple[str, Any, str, dict[str, Any], dict[str, str], dict[str, int]]]:
    """(label, kernel, dtype, constexprs, argument types, launch options) as the wrappers launch them."""
    floats = {"eps": "fp32", "scale_log2": "fp32", **INDEX_POINTERS}
    splits = {**floats, "partial_ptr": "*fp32", "lse_ptr": "*fp32"}
    cases = [
        ("rms_norm", norm._rms_norm_kernel, "bf16", {"HAS_RESIDUAL": False, "BLOCK": 4096, "summed_ptr": None}, floats,
         {"num_warps": 16}),
        ("fused_add_rms_norm", norm._rms_norm_kernel, "bf16", {"HAS_RESIDUAL": True, "BLOCK": 4096}, floats,
         {"num_warps": 16}),
        ("silu_and_mul", activation._silu_and_mul_kernel, "bf16", {"BLOCK": 1024}, floats, {"num_warps": 4}),
        ("kv_cache_store", kv_cache._store_kernel, "bf16", {"BLOCK": 1024}, floats, {"num_warps": 4}),
    ]
    for is_neox, rest in ((True, 0), (False, 64)):
        cases.append((f"rotary neox={is_neox} rest={rest}", rotary._rotary_kernel, "bf16",
                      {"IS_NEOX": is_neox, "BLOCK_Q_HEADS": 32, "BLOCK_K_HEADS": 8, "BLOCK_PAIRS": 32,
                       "BLOCK_REST": rest}, floats, {"num_warps": 16}))
    moe = {"sorted_slots_ptr": "*i32", "block_experts_ptr": "*i32", "weights_ptr": "*fp32", "order_ptr": "*i64"}
    for dtype, dot, precision, block_k in (("bf16", tl.bfloat16, "tf32", 64), ("fp32", tl.float32, "ieee", 32)):
        for label, slots_per_row, weighted in (("w13", 8, False), ("w2", 1, True)):
            constexprs = {"SLOTS_PER_ROW": slots_per_row, "APPLY_WEIGHT": weighted, "BLOCK_M": 64, "BLOCK_N": 64,
                          "BLOCK_K": block_k, "b_k_stride": 1, "DOT_DTYPE": dot, "PRECISION": precision}
            cases.append((f"fused_moe {label} {dtype}", fused_moe._grouped_gemm_kernel, dtype,
                          constexprs if weighted else {**constexprs, "weights_ptr": None}, moe,
                          {"num_warps": 4, "num_stages": 3}))
    cases.append(("fused_moe sum", fused_moe._sum_kernel, "bf16", {"TOP_K": 8, "BLOCK": 1024}, moe, {"num_warps": 4}))
    for dtype, dot, precision, block_m, block_n in (("bf16", tl.bfloat16, "tf32", 64, 64),
                                                    ("fp32", tl.float32, "ieee", 32, 32)):
        tiles = {"DOT_DTYPE": dot, "PRECISION": precision, "BLOCK_D": 128, "BLOCK_N": block_n}
        cases += [
            (f"prefill {dtype}", attention_prefill._prefill_kernel, dtype, {"GROUP": 4, "BLOCK_M": block_m, **tiles},
             floats, {"num_warps": 8, "num_stages": 2}),
            (f"decode split {dtype}", attention_decode._split_kernel, dtype, {"GROUP": 4, "BLOCK_H": 16, **tiles},
             splits, {"num_warps": 4, "num_stages": 2}),
            (f"decode merge {dtype}", attention_decode._merge_kernel, dtype, {"BLOCK_S": 16, "BLOCK_D": 128}, splits,
             {"num_warps": 1}),
        ]
    # MLA at DeepSeek-V2/V3 widths (kv_lora_rank 512, rope 64), with the tiles the wrapper picks per dtype.
    for dtype, dot, precision, element_size in (("bf16", tl.bfloat16, "tf32", 2), ("fp32", tl.float32, "ieee", 4)):
        block_m, block_n = mla_attention.tile_sizes(element_size)
        cases.append((f"mla {dtype}", mla_attention._mla_kernel, dtype,
                      {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_C": 512, "BLOCK_R": 64, "DOT_DTYPE": dot,
                       "PRECISION": precision}, floats, {"num_warps": 8, "num_stages": 2}))
    # Quantized linears: each weight format's dequantize-GEMM (fp8 bytes as u8) and the activation quantizers.
    for fmt, weight, scale, aux in ((quant_gemm.FP8, "*u8", "*fp32", None), (quant_gemm.INT4, "*u8", "*fp32", None),
                                    (quant_gemm.NVFP4, "*u8", "*u8", "*fp32"), (quant_gemm.MXFP4, "*u8", "*u8", None)):
        for dtype, dot, precision in (("bf16", tl.bfloat16, "tf32"), ("fp32", tl.float32, "ieee")):
            constexprs = {"FORMAT": fmt, "HAS_BIAS": True, "BLOCK_M": 64, "BLOCK_N": quant_gemm._BLOCK_N,
                          "BLOCK_K": quant_gemm._BLOCK_K, "DOT_DTYPE": dot, "PRECISION": precision}
            cases.append((f"quant gemm {fmt.value} {dtype}", quant_gemm._dequant_gemm_kernel, dtype,
                          constexprs if aux else {**constexprs, "aux_ptr": None},
                          {"w_ptr": weight, "scale_ptr": scale, **({"aux_ptr": aux} if aux else {})},
                          {"num_warps": 4, "num_stages": 3}))
    quantizer = {"static_scale_ptr": "*fp32", "amax_bound": "fp32", "global_ptr": "*fp32"}
    for mode in (quant_activation.MODE_FP8, quant_activation.MODE_FP8_STATIC, quant_activation.MODE_INT8):
        cases.append((f"quant activation mode {mode.value}", quant_activation._fake_quantize_kernel, "bf16",
                      {"MODE": mode, "UE8M0": True, "HAS_BOUND": True, "BLOCK": 1024}, quantizer, {"num_warps": 4}))
    cases.append(("quant activation nvfp4", quant_activation._nvfp4_kernel, "bf16", {"BLOCK": 1024, "GROUP": 16},
                  quantizer, {"num_warps": 4}))
    # State ops at Qwen3-Next widths: the conv of bf16 inputs into a float32 state (decode and prefill tiles, as the
    # wrapper picks them), and the gated delta rule's [128, 8] state slice; Mamba2's scan at Nemotron-H's (bf16 inputs,
    # an [8, 128] slice of the float32 state, float32 A and output).
    state_ops = {"state_ptr": "*fp32", **{name: "*i64" for name in ("slots_ptr", "query_start_ptr", "kept_starts_ptr",
                                                                   "kept_tokens_ptr", "kept_targets_ptr")}}
    no_kept = {"kept_starts_ptr": None, "kept_tokens_ptr": None, "kept_targets_ptr": None}
    for block_t, block_c, kept in ((4, 256, False), (32, 64, True)):
        constexprs = {"KERNEL": 4, "BLOCK_T": block_t, "BLOCK_C": block_c, "BLOCK_H": 4, "HAS_BIAS": kept,
                      "HAS_KEPT": kept, **({} if kept else {"bias_ptr": None, **no_kept})}
        cases.append((f"causal_conv block_t={block_t}", causal_conv._causal_conv_kernel, "bf16", constexprs, state_ops,
                      {"num_warps": 4 if block_t == 4 else 8}))
    for kept in (False, True):
        kept_rows = {"HAS_KEPT": kept, **({} if kept else {"kept_starts_ptr": None, "kept_targets_ptr": None})}
        cases.append((f"gated_delta_rule kept={kept}", gated_delta._gated_delta_kernel, "fp32",
                      {"GROUP": 2, "BLOCK_K": 128, "BLOCK_V": 8, **kept_rows}, state_ops, {"num_warps": 1}))
        cases.append((f"ssd_scan kept={kept}", ssd._ssd_kernel, "bf16",
                      {"GROUP": 16, "BLOCK_P": 8, "BLOCK_N": 128, **kept_rows},
                      {**state_ops, "A_ptr": "*fp32", "out_ptr": "*fp32"}, {"num_warps": 1}))
    # Multi-LoRA: shrink and expand at a decode's and a prefill's token blocks, rank 16 (a 64-rank step for larger).
    lora_types = {"shrunk_ptr": "*fp32", "sorted_tokens_ptr": "*i64", "slot_starts_ptr": "*i64"}
    for dtype, dot, precision, block_k in (("bf16", tl.bfloat16, "tf32", 64), ("fp32", tl.float32, "ieee", 32)):
        for block_m in (16, 64):
            cases.append((f"lora shrink {dtype} block_m={block_m}", lora._shrink_kernel, dtype,
                          {"BLOCK_M": block_m, "BLOCK_R": 16, "BLOCK_K": block_k, "DOT_DTYPE": dot,
                           "PRECISION": precision}, lora_types, {"num_warps": 4, "num_stages": 3}))
            cases.append((f"lora expand {dtype} block_m={block_m}", lora._expand_kernel, dtype,
                          {"BLOCK_M": block_m, "BLOCK_N": lora._BLOCK_N, "BLOCK_R": 64}, lora_types,
                          {"num_warps": 4, "num_stages": 2}))
    return cases


def main(capabilities: tuple[int, ...] = (90, 80)) -> int:
    failures = 0
    for capability in capabilities:
        target = GPUTarget("cuda", capability, 32)
        for label, fn, dtype, constexprs, types, options in _cases():
            attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in ALIGNED.get(fn, ())}
            source = ASTSource(fn, _signature(fn, dtype, constexprs, types), constexprs, attrs)
            try:
                shared = triton.compile(source, target=target, options=options).metadata.shared
            except Exception as error:  # report every kernel, not only the first failure
                print(f"FAIL sm_{capability} {label}: {type(error).__name__}: {error}")
                failures += 1
                continue
            over = shared > SHARED_MEMORY_BUDGET
            failures += over
            print(f"{'FAIL' if over else 'ok'} sm_{capability} {label}: {shared} bytes of shared memory")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
