"""The CPU op extension: one JIT-built module (`csrc/cpu_ops.cpp` binds every CPU kernel), shared by the
`cpu_paged` attention backend and the `cpu_cpp` fused ops; `skip_reason` is their `available` condition.
"""

from __future__ import annotations

from rapid_llm.ops.cpp.jit import CPU_CFLAGS, CPU_LDFLAGS, JitExtension

CPU_OPS = JitExtension("rapid_llm_cpu_ops", ("cpu_ops.cpp", "paged_attention.cpp", "prefill_attention.cpp",
                                            "fused_elementwise.cpp", "kv_cache_store.cpp", "amx_linear.cpp",
                                            "avx512_linear.cpp", "amx_moe.cpp", "token_bitmask.cpp",
                                            "state_decode.cpp", "lora.cpp", "decode_layers.cpp"),
                       cflags=CPU_CFLAGS, ldflags=CPU_LDFLAGS)


def skip_reason(device_type: str, dtype: str) -> str | None:
    return CPU_OPS.skip_reason()
