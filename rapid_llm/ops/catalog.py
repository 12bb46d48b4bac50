"""Every built-in op implementation, registered by name with its kernel as a "module:function" string.

Kept free of torch so the launcher can check --op-backend against it; a kernel's module is imported
only when dispatch first picks it. Adding an implementation = its file + one register_op call here.
torch_ref is the always-available reference (the correctness oracle) of every op.
"""

from __future__ import annotations

from typing import Any

from rapid_llm.ops.registry import register_op

REFERENCE = "torch_ref"


def _fp32_pays_off(x: Any, *rest: Any) -> bool:
    # Imported on call: this module stays torch-free for the launcher; after the first call it is a lookup.
    from rapid_llm.ops.cpu_half import fp32_pays_off

    return fp32_pays_off(x)


register_op(name="rms_norm", backend=REFERENCE, fn="rapid_llm.ops.norm:rms_norm")
register_op(name="rms_norm", backend="torch_fused", fn="rapid_llm.ops.rms_norm_fused:rms_norm", priority=-10,
            conditions={"dtype": ["fp32"]})
register_op(name="fused_add_rms_norm", backend=REFERENCE, fn="rapid_llm.ops.norm:fused_add_rms_norm")
register_op(name="silu_and_mul", backend=REFERENCE, fn="rapid_llm.ops.activation:silu_and_mul")
register_op(name="rotary_embedding", backend=REFERENCE, fn="rapid_llm.ops.rotary:rotary_embedding")
register_op(name="linear", backend=REFERENCE, fn="torch.nn.functional:linear")
register_op(name="linear", backend="cpu_fp32", fn="rapid_llm.ops.cpu_half:linear", priority=10,
            conditions={"device": "cpu", "dtype": ["bf16", "fp16"], "predicate": _fp32_pays_off})
register_op(name="fused_moe", backend=REFERENCE, fn="rapid_llm.ops.moe:fused_moe")
register_op(name="kv_cache_store", backend=REFERENCE, fn="rapid_llm.ops.attention.backend:write_kv_cache")
# Attention's implementation is an AttentionBackend (metadata built once per step, then a forward per
# layer): the worker selects it once for the model's device and dtype and binds it to every layer.
register_op(name="attention", backend=REFERENCE, fn="rapid_llm.ops.attention.torch_ref:TORCH_REF_BACKEND")

# C++/CUDA extensions, built on first selection (`ops/cpp/jit.py`): `available` compiles or loads them
# then and turns a missing toolchain or a failed build into a skip reason.
register_op(name="attention", backend="cpu_paged", fn="rapid_llm.ops.attention.cpu_paged:CPU_PAGED_BACKEND",
            priority=10, conditions={"device": "cpu", "dtype": ["fp32", "bf16", "fp16"],
                                     "available": "rapid_llm.ops.attention.cpu_paged:skip_reason"})
register_op(name="silu_and_mul", backend="cuda_cpp", fn="rapid_llm.ops.cpp.cuda_activation:silu_and_mul",
            priority=10, conditions={"device": "cuda", "dtype": ["fp32", "bf16", "fp16"],
                                     "available": "rapid_llm.ops.cpp.cuda_activation:skip_reason"})
# Optional libraries, as thin adapters onto their public APIs (untested without the library and a GPU):
# below torch_ref, so they are opt-in (--op-backend) until a GPU check verifies them. FlashMLA is not here:
# it computes MLA (V is a prefix of the shared latent K cache), which needs an MLA op and model (issue 12).
register_op(name="attention", backend="flash_attn", fn="rapid_llm.ops.attention.flash_attn:FLASH_ATTN_BACKEND",
            priority=-10, conditions={"device": "cuda", "sm": ">=8.0", "dtype": ["bf16", "fp16"], "lib": "flash_attn"})
register_op(name="attention", backend="flashinfer", fn="rapid_llm.ops.attention.flashinfer:FLASHINFER_BACKEND",
            priority=-10, conditions={"device": "cuda", "sm": ">=7.5", "dtype": ["bf16", "fp16"], "lib": "flashinfer"})
register_op(name="linear", backend="deep_gemm", fn="rapid_llm.ops.deep_gemm_linear:linear", priority=-10,
            conditions={"device": "cuda", "sm": ">=9.0", "dtype": "bf16", "lib": "deep_gemm"})
