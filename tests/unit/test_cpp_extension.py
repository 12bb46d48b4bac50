"""The JIT C++ extension path: first build and cached load are logged, a missing compiler or a failed build is a
skip reason (never an error), and the catalog picks cpu_paged on a CPU where the extension builds."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rapid_llm import build_ops
from rapid_llm.ops.amx_linear import amx_missing
from rapid_llm.ops.attention import cpu_paged
from rapid_llm.ops.cpp.cpu_ops import skip_reason
from rapid_llm.ops.cpp import jit
from rapid_llm.ops.cpp.jit import CACHE_ENV, JitExtension
from rapid_llm.ops.registry import REGISTRY

# A pybind11-only module compiles in seconds (no torch headers).
TINY_SOURCE = """
#include <pybind11/pybind11.h>
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) { module.def("answer", [] { return 42; }); }
"""


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private source folder and extension cache for one test."""
    monkeypatch.setattr(jit, "SOURCE_DIR", tmp_path / "csrc")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    (tmp_path / "csrc").mkdir()
    return tmp_path / "csrc"


def test_first_build_then_cached_load_are_logged(sources: Path, caplog: pytest.LogCaptureFixture) -> None:
    (sources / "tiny.cpp").write_text(TINY_SOURCE)
    extension = JitExtension("rapid_llm_test_tiny", ("tiny.cpp",), cflags=("-O1",))
    caplog.set_level(logging.INFO, logger=jit.__name__)
    assert extension.skip_reason() is None and extension.load().answer() == 42
    assert "compiling C++ op extension rapid_llm_test_tiny into" in caplog.text
    assert "once per environment (about 2-4 minutes on 2 cores" in caplog.text
    assert "compiled C++ op extension rapid_llm_test_tiny in" in caplog.text
    assert extension.build_directory().parent == sources.parent / "cache"
    # The next build of it (new sources, another environment) announces the time this one took.
    recorded = jit._last_build_seconds("rapid_llm_test_tiny")
    assert recorded is not None and recorded > 0
    caplog.clear()
    jit._load.cache_clear()  # what a new process sees: the library is in the cache
    assert extension.load().answer() == 42
    assert "loaded C++ op extension rapid_llm_test_tiny from the cache" in caplog.text
    assert "compiling" not in caplog.text


def test_build_ops_builds_now_what_the_server_would_load(sources: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    (sources / "tiny.cpp").write_text(TINY_SOURCE)
    tiny = JitExtension("rapid_llm_test_install", ("tiny.cpp",), cflags=("-O1",))
    absent = JitExtension("rapid_llm_test_cuda", ("absent.cu",))
    monkeypatch.setattr(build_ops, "EXTENSIONS", (tiny, absent))
    monkeypatch.setattr(jit.torch.cuda, "is_available", lambda: False)
    assert build_ops.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("rapid_llm_test_install: ready in ")
    assert lines[2].startswith("rapid_llm_test_cuda: skipped (") and "torch reference" in lines[2]
    assert list(tiny.build_directory().glob("rapid_llm_test_install*.so"))


def test_the_cache_key_follows_sources_and_flags(sources: Path) -> None:
    (sources / "tiny.cpp").write_text(TINY_SOURCE)
    first = JitExtension("rapid_llm_test_key", ("tiny.cpp",), cflags=("-O1",))
    assert first.build_directory() != JitExtension("rapid_llm_test_key", ("tiny.cpp",), cflags=("-O2",)).build_directory()
    before = first.build_directory()
    (sources / "tiny.cpp").write_text(TINY_SOURCE + "// changed\n")
    assert first.build_directory() != before


def test_a_failed_build_is_a_skip_reason(sources: Path, caplog: pytest.LogCaptureFixture) -> None:
    (sources / "broken.cpp").write_text("this is not C++\n")
    reason = JitExtension("rapid_llm_test_broken", ("broken.cpp",)).skip_reason()
    assert reason is not None and reason.startswith("C++ extension rapid_llm_test_broken failed to build: ")
    assert "building C++ op extension rapid_llm_test_broken failed" in caplog.text


def test_a_missing_compiler_is_a_skip_reason_without_building(sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "rapid_llm_no_such_compiler")
    reason = JitExtension("rapid_llm_test_no_compiler", ("absent.cpp",)).skip_reason()
    assert reason == ("C++ extension rapid_llm_test_no_compiler cannot be built: no C++ compiler "
                      "('rapid_llm_no_such_compiler') on PATH")
    assert not (sources.parent / "cache").exists()


@pytest.mark.skipif(skip_reason("cpu", "float32") is not None, reason=str(skip_reason("cpu", "float32")))
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_extension_s_ops_are_the_cpu_defaults(dtype: str) -> None:
    selection = REGISTRY.select("attention", "cpu", dtype)
    if dtype == "bf16" and amx_missing("cpu", dtype) is None:
        assert selection.backend == "cpu_amx" and selection.fn is cpu_paged.CPU_AMX_BACKEND
    else:
        assert selection.backend == "cpu_paged" and selection.fn is cpu_paged.CPU_PAGED_BACKEND
    for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "lora"):
        assert REGISTRY.select(op, "cpu", dtype).backend == "cpu_cpp"
