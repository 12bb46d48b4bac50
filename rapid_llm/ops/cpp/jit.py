"""Build a C++/CUDA op extension on first use with `torch.utils.cpp_extension.load`, into a persistent cache.

A `JitExtension` names its sources (in `csrc/`, shipped as package data) and flags. The build directory
is `$RAPID_LLM_EXTENSION_CACHE` (default `~/.cache/rapid_llm/torch_extensions`) / `<name>-<key>`, where
the key hashes the sources and headers, flags, compiler, torch and Python versions and the CPU's feature
flags (`-march=native` code must not be reused on another CPU). `python -m rapid_llm.build_ops` builds at
install time; otherwise the first start compiles (logging progress, the expected and the taken time). Later
starts import the built library directly, without asking ninja (which would rebuild after a checkout
touched the sources' file times). `skip_reason()` is what the op registry's `available`
condition calls when dispatch first considers an implementation: it builds or loads (once per process,
`functools.cache`) and turns a missing compiler or a failed build into a skip reason, never an error.
Usage:
    CPU_OPS = JitExtension("rapid_llm_cpu_ops", ("cpu_ops.cpp", ...), cflags=CPU_CFLAGS)
    CPU_OPS.skip_reason()  # None when usable; CPU_OPS.load().paged_attention(...)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

CACHE_ENV = "RAPID_LLM_EXTENSION_CACHE"
SOURCE_DIR = Path(__file__).parent / "csrc"
# -march=native: the kernels rely on the compiler vectorising their loops for this CPU (the cache key
# holds its feature flags); OpenMP for the parallel loops (torch's own libgomp.so.1 is the one loaded).
CPU_CFLAGS = ("-O3", "-march=native", "-fopenmp")
CPU_LDFLAGS = ("-fopenmp",)
PROGRESS_INTERVAL_S = 15.0
BUILD_TIMES_FILE = "build_seconds.json"  # in cache_root(): each extension's last build time, for the next estimate


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rapid_llm" / "torch_extensions")


@functools.cache
def cpu_features() -> str:
    """The CPU's feature flags (Linux /proc/cpuinfo), else the best description the platform gives."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


@dataclass(frozen=True, eq=False)  # hashed by identity: `load()`'s cache lookup is on every op's hot path
class JitExtension:
    name: str
    sources: tuple[str, ...]  # file names in csrc/
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()

    @property
    def is_cuda(self) -> bool:
        return any(source.endswith(".cu") for source in self.sources)

    def build_directory(self) -> Path:
        digest = hashlib.sha256()
        for source in (*self.sources, *sorted(path.name for path in SOURCE_DIR.glob("*.h"))):
            digest.update((SOURCE_DIR / source).read_bytes())
        compiler = shutil.which(os.environ.get("CXX", "c++")) or ""
        for part in (self.cflags, self.ldflags, self.cuda_cflags, compiler, torch.__version__, sys.version,
                     cpu_features(), torch.version.cuda or ""):
            digest.update(repr(part).encode())
        return cache_root() / f"{self.name}-{digest.hexdigest()[:16]}"

    def missing_toolchain(self) -> str | None:
        """Why this extension cannot be built here at all, without trying (None when it can)."""
        from torch.utils import cpp_extension

        compiler = os.environ.get("CXX", "c++")
        if shutil.which(compiler) is None:
            return f"no C++ compiler ({compiler!r}) on PATH"
        if not cpp_extension.is_ninja_available():
            return "ninja (needed by torch.utils.cpp_extension) is not installed"
        if self.is_cuda:
            if torch.version.cuda is None:
                return "this torch build has no CUDA"
            if not torch.cuda.is_available():
                return "no CUDA device"
            if cpp_extension.CUDA_HOME is None:
                return "nvcc / CUDA_HOME not found"
        return None

    def load(self) -> Any:
        """The built module (compiled on the first start, loaded from the cache later); raises on failure."""
        return _load(self)

    def skip_reason(self) -> str | None:
        """None when the extension is usable; otherwise why not (logged once with the build's error)."""
        return _skip_reason(self)


def _import_built(library: Path) -> Any:
    """Import a built extension module directly: its directory is keyed by the sources' contents, so a
    library there is current, and ninja (which decides by file times) must not rebuild it after a checkout."""
    spec = importlib.util.spec_from_file_location(library.stem, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the built extension {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _load(extension: JitExtension) -> Any:
    from torch.utils import cpp_extension

    directory = extension.build_directory()
    built = sorted(directory.glob(f"{extension.name}*.so"), key=lambda path: path.stat().st_mtime)
    start = time.perf_counter()
    if built:
        module = _import_built(built[-1])
        logger.info("loaded C++ op extension %s from the cache %s in %.2f s", extension.name, directory,
                    time.perf_counter() - start)
        return module
    directory.mkdir(parents=True, exist_ok=True)
    expected = _last_build_seconds(extension.name)
    logger.info("compiling C++ op extension %s into %s, once per environment (%s; `python -m rapid_llm.build_ops` "
                "does it at install time)", extension.name, directory,
                f"the last build here took {expected:.0f} s" if expected else "about 2-4 minutes on 2 cores")
    with _ProgressTicker(extension.name, start):
        module = cpp_extension.load(
            name=extension.name,
            sources=[str(SOURCE_DIR / source) for source in extension.sources],
            extra_cflags=list(extension.cflags),
            extra_ldflags=list(extension.ldflags),
            extra_cuda_cflags=list(extension.cuda_cflags),
            build_directory=str(directory),
            with_cuda=extension.is_cuda,
            verbose=False,
        )
    seconds = time.perf_counter() - start
    _record_build_seconds(extension.name, seconds)
    logger.info("compiled C++ op extension %s in %.1f s", extension.name, seconds)
    return module


class _ProgressTicker:
    """Logs every PROGRESS_INTERVAL_S that a build is still running, so a long first start is not silent."""

    def __init__(self, name: str, start: float) -> None:
        self.name, self.start = name, start
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, name=f"build-{name}", daemon=True)

    def __enter__(self) -> "_ProgressTicker":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _tick(self) -> None:
        while not self._done.wait(PROGRESS_INTERVAL_S):
            logger.info("still compiling C++ op extension %s: %.0f s so far", self.name,
                        time.perf_counter() - self.start)


def _last_build_seconds(name: str) -> float | None:
    """How long this extension's previous build took on this machine (any source version), if one was recorded."""
    try:
        return float(json.loads((cache_root() / BUILD_TIMES_FILE).read_text())[name])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_build_seconds(name: str, seconds: float) -> None:
    path = cache_root() / BUILD_TIMES_FILE
    try:
        times = json.loads(path.read_text()) if path.is_file() else {}
        times[name] = round(seconds, 1)
        path.write_text(json.dumps(times))
    except (OSError, ValueError) as error:  # only the next estimate is lost
        logger.debug("could not record the build time in %s: %s", path, error)


@functools.cache
def _skip_reason(extension: JitExtension) -> str | None:
    missing = extension.missing_toolchain()
    if missing is not None:
        return f"C++ extension {extension.name} cannot be built: {missing}"
    try:
        extension.load()
    except (RuntimeError, OSError, ImportError) as error:  # a compile/link error, or a library that won't load
        logger.warning("building C++ op extension %s failed; its ops are skipped:\n%s", extension.name, error)
        last_line = next((line for line in reversed(str(error).splitlines()) if line.strip()), type(error).__name__)
        return f"C++ extension {extension.name} failed to build: {last_line.strip()}"
    return None
