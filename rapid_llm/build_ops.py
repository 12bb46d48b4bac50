"""`python -m rapid_llm.build_ops`: compile the C++ op extensions now (the install step), not at the first start.

Key design choice: it builds exactly what the server would build on its first start, into the same cache
(`ops/cpp/jit.py` keys it by sources, flags, compiler, torch, Python and CPU), so a server started afterwards
in the same environment loads the library in milliseconds. An extension this machine cannot build (no
compiler, no CUDA device) or whose build fails is reported and skipped with exit code 0: the server then runs
those ops on their torch reference, as it would have anyway.
Usage: `pip install -e . && python -m rapid_llm.build_ops` (prints each extension's outcome and time).
"""

from __future__ import annotations

import logging
import sys
import time

from rapid_llm.ops.cpp.cpu_ops import CPU_OPS
from rapid_llm.ops.cpp.cuda_activation import CUDA_OPS
from rapid_llm.ops.cpp.jit import JitExtension, cache_root

EXTENSIONS: tuple[JitExtension, ...] = (CPU_OPS, CUDA_OPS)


def build(extension: JitExtension) -> str:
    """One line saying what became of `extension`."""
    missing = extension.missing_toolchain()
    if missing is not None:
        return f"{extension.name}: skipped ({missing}); the server uses the torch reference for its ops"
    start = time.perf_counter()
    reason = extension.skip_reason()
    if reason is not None:
        return f"{extension.name}: {reason}; the server uses the torch reference for its ops"
    return f"{extension.name}: ready in {time.perf_counter() - start:.1f} s ({extension.build_directory()})"


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    print(f"building rapid_llm's C++ op extensions into {cache_root()} (about 2-4 minutes on 2 cores, once)",
          flush=True)
    for extension in EXTENSIONS:
        print(build(extension), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
