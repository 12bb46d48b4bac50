"""FlashAttention, FlashInfer, DeepGEMM and FlashMLA adapters: selected when their library is installed and the device
conditions hold, skipped with "optional library ... is not installed" otherwise.

The libraries are stand-in packages written to a temporary folder on sys.path, and the GPU is a registry with
a faked compute capability; nothing here calls a kernel (the stand-ins' functions raise if called), so these
tests check selection only, never numerics.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rapid_llm.ops.conditions import library_available
from rapid_llm.ops.registry import REGISTRY, NoImplementationError, OpRegistry

STAND_INS = {
    "flash_attn": "def flash_attn_varlen_func(*args, **kwargs):\n    raise RuntimeError('stand-in')\n",
    "flashinfer": "class BatchPrefillWithPagedKVCacheWrapper:\n    def __init__(self, *args, **kwargs):\n"
                  "        raise RuntimeError('stand-in')\n",
    "deep_gemm": "def bf16_gemm_nt(*args, **kwargs):\n    raise RuntimeError('stand-in')\n",
    "flash_mla": "def get_mla_metadata(*args, **kwargs):\n    raise RuntimeError('stand-in')\n\n\n"
                 "flash_mla_with_kvcache = get_mla_metadata\n",
}
# (op, backend, dtype, adapter module, attribute the selection returns)
ADAPTERS = [
    ("attention", "flash_attn", "bf16", "rapid_llm.ops.attention.flash_attn", "FLASH_ATTN_BACKEND"),
    ("attention", "flashinfer", "fp16", "rapid_llm.ops.attention.flashinfer", "FLASHINFER_BACKEND"),
    ("linear", "deep_gemm", "bf16", "rapid_llm.ops.deep_gemm_linear", "DEEP_GEMM_LINEAR"),
    ("mla_attention", "flash_mla", "bf16", "rapid_llm.ops.attention.flash_mla", "FLASH_MLA_BACKEND"),
]


def fake_gpu_registry(op: str, capability: tuple[int, int]) -> OpRegistry:
    """The catalog's implementations of `op`, in a registry whose CUDA device has `capability`."""
    registry = OpRegistry(capability=lambda _: capability)
    for impl in REGISTRY.implementations(op):
        registry.register(name=op, backend=impl.backend, fn=impl.fn, priority=impl.priority,
                          conditions=impl.conditions)
    return registry


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, source in STAND_INS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    library_available.cache_clear()
    yield
    library_available.cache_clear()
    for module in [*STAND_INS, *(adapter for *_, adapter, _ in ADAPTERS)]:
        sys.modules.pop(module, None)  # the adapters imported the stand-ins: forget both


@pytest.fixture
def absent() -> None:
    for name in STAND_INS:
        if library_available(name):
            pytest.skip(f"{name} is really installed here")


@pytest.mark.usefixtures("stand_ins")
@pytest.mark.parametrize(("op", "backend", "dtype", "module", "attribute"), ADAPTERS)
def test_selected_when_the_library_is_present(op: str, backend: str, dtype: str, module: str, attribute: str) -> None:
    registry = fake_gpu_registry(op, (9, 0))
    registry.set_overrides({op: backend})  # below torch_ref by priority: opt-in until verified on a GPU
    selection = registry.select(op, "cuda", dtype)
    assert selection.backend == backend
    assert selection.fn is getattr(sys.modules[module], attribute)
    assert sys.modules[backend].__file__.startswith(str(Path(sys.path[0])))  # the stand-in, not a real library


@pytest.mark.usefixtures("stand_ins")
def test_by_priority_they_stay_behind_torch_ref_and_conditions_still_apply() -> None:
    registry = fake_gpu_registry("linear", (8, 0))
    assert registry.select("linear", "cuda", "bf16").backend == "torch_ref"
    registry.set_overrides({"linear": "deep_gemm"})
    with pytest.raises(NoImplementationError, match="deep_gemm .*needs sm >=9.0, the device is sm 8.0"):
        registry.select("linear", "cuda", "bf16")
    assert fake_gpu_registry("attention", (9, 0)).select("attention", "cpu", "bf16").backend != "flash_attn"
    mla = fake_gpu_registry("mla_attention", (8, 0))
    assert mla.select("mla_attention", "cuda", "bf16").backend == "triton"  # the default on CUDA, not flash_mla
    mla.set_overrides({"mla_attention": "flash_mla"})
    with pytest.raises(NoImplementationError, match="flash_mla .*needs sm >=9.0, the device is sm 8.0"):
        mla.select("mla_attention", "cuda", "bf16")


@pytest.mark.usefixtures("absent")
@pytest.mark.parametrize(("op", "backend", "dtype", "module", "attribute"), ADAPTERS)
def test_skipped_with_a_reason_when_the_library_is_absent(op: str, backend: str, dtype: str, module: str,
                                                          attribute: str) -> None:
    registry = fake_gpu_registry(op, (9, 0))
    registry.set_overrides({op: backend})
    with pytest.raises(NoImplementationError, match=f"{backend} .*: optional library {backend!r} is not installed"):
        registry.select(op, "cuda", dtype)
    assert module not in sys.modules
