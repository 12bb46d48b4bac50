"""The cpu_amx skip reason names the CPU flags that are missing (an AVX512-BF16 CPU without AMX tiles was
told it had neither)."""

from __future__ import annotations

from rapid_llm.ops.amx_linear import amx_missing, missing_amx_flags
from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.cpp.jit import cpu_features


def test_missing_flags_are_named_from_the_flags_line() -> None:
    epyc = "flags : fpu avx2 avx512f avx512_bf16 avx512_vnni"
    assert missing_amx_flags(epyc) == ["amx_tile", "amx_bf16"]
    assert missing_amx_flags("flags : avx2 amx_bf16 amx_tile avx512_bf16 amx_int8") == []
    assert missing_amx_flags("flags : sse4_2 avx2") == ["amx_tile", "amx_bf16", "avx512_bf16"]


def test_the_reason_on_this_machine_names_what_it_lacks() -> None:
    reason = amx_missing("cpu", "bf16")
    if CPU_OPS.skip_reason() is not None:
        assert reason == CPU_OPS.skip_reason()
        return
    missing = missing_amx_flags(cpu_features())
    if reason is None:
        assert missing == []
    elif missing:
        assert reason.startswith(f"this CPU lacks {' and '.join(missing)} ")
    else:
        assert "refuses this process AMX tile state" in reason
